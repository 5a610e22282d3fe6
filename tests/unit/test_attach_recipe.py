"""What `flare2 attach` plays (the run's recipe from the manager, and which of its own options may change it), and the
batch script `flare2 slurm` submits."""

from __future__ import annotations

import logging
import sys

import pytest

from flare2.commands.attach import AttachConfig, plan_agents
from flare2.commands.slurm import SlurmJob
from flare2.errors import ConfigError

RECIPE = {
    "agent": "flare2.core.envs:GymAgent",
    "agent_kwargs": {"env_id": "Acrobot-v1", "transforms": [["normalize_observations", {}]], "sample_interval": 256},
    "envs_per_agent": 16,
    "seed": 3,
    "first_slot": 1025,
}


def config(**options) -> AttachConfig:
    return AttachConfig("tcp://10.0.0.1:5555", **options)


def test_with_no_agent_options_attach_plays_the_runs_recipe():
    plan = plan_agents(config(), RECIPE)
    assert (plan.agent_path, plan.agent_kwargs, plan.envs_per_agent, plan.seed, plan.first_slot) == (
        RECIPE["agent"],
        RECIPE["agent_kwargs"],
        16,
        3,
        1025,
    )


def test_options_that_only_change_how_much_is_played_here_are_taken_and_logged(caplog):
    with caplog.at_level(logging.INFO):
        plan = plan_agents(config(envs_per_agent=4, seed=9, agent_kwargs={"env_id": "Acrobot-v1"}), RECIPE)
    assert (plan.envs_per_agent, plan.seed, plan.agent_kwargs) == (4, 9, RECIPE["agent_kwargs"])
    assert "plays 4 envs (the run's agents play 16)" in caplog.text
    assert "--seed 9 (the run's seed is 3)" in caplog.text


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"agent_path": "mine:Agent"},
            "--agent mine:Agent: the run's agents are flare2.core.envs:GymAgent",
        ),
        (
            {"agent_kwargs": {"env_id": "CartPole-v1"}},
            "--agent-kwargs sets 'env_id' to 'CartPole-v1', the run's agents play with 'Acrobot-v1'",
        ),
        ({"agent_kwargs": {"transforms": []}}, "--agent-kwargs sets 'transforms' to [], the run's agents play with"),
        ({"agent_kwargs": {"frames": 4}}, "--agent-kwargs sets 'frames', which the run's agents leave at its default"),
    ],
)
def test_an_option_that_would_change_what_reaches_the_runs_cts_is_refused_naming_it(options, message):
    with pytest.raises(ConfigError, match="leave the option out") as refused:
        plan_agents(config(**options), RECIPE)
    assert message in str(refused.value)


@pytest.mark.parametrize("recipe", [None, {}, {**RECIPE, "seed": "3"}, {**RECIPE, "agent_kwargs": []}])
def test_an_answer_without_a_valid_recipe_names_the_versions(recipe):
    with pytest.raises(ConfigError, match="run the same flare2 version on both sides"):
        plan_agents(config(), recipe)


def test_bad_attach_options_are_refused_naming_them():
    with pytest.raises(ConfigError, match="--rejoin-for must be >= 0"):
        config(rejoin_for_s=-1)
    with pytest.raises(ConfigError, match="--envs-per-agent must be >= 1"):
        config(envs_per_agent=0)


def test_the_slurm_job_runs_one_attach_per_node_with_the_options_given():
    job = SlurmJob(
        "tcp://10.0.0.1:5555",
        ("--keys", "my keys/", "--num-agents", "2"),
        nodes=4,
        partition="cpu",
        time="4:00:00",
        cpus_per_node=8,
        python="/shared/venv/bin/python",
        sbatch_options=("--account=lab",),
    )
    script = job.script()
    for line in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --partition=cpu",
        "#SBATCH --time=4:00:00",
        "#SBATCH --account=lab",
        "srun --kill-on-bad-exit=0 /shared/venv/bin/python -m flare2.cli attach tcp://10.0.0.1:5555 --keys 'my keys/' "
        "--num-agents 2",
    ):
        assert line in script.splitlines()
    assert "#SBATCH --output=flare2-attach-%j.out" in script.splitlines()
    learners = SlurmJob("tcp://10.0.0.1:5555", ("--keys", "keys/", "--learners", "2"), nodes=2, command="learn")
    for line in (
        "#SBATCH --job-name=flare2-learn",
        "#SBATCH --output=flare2-learn-%j.out",
        f"srun --kill-on-bad-exit=0 {sys.executable} -m flare2.cli learn tcp://10.0.0.1:5555 --keys keys/ --learners 2",
    ):
        assert line in learners.script().splitlines()
    with pytest.raises(ConfigError, match="a Slurm job runs flare2 attach or learn on its nodes, not 'train'"):
        SlurmJob("tcp://10.0.0.1:5555", (), nodes=1, command="train")
    with pytest.raises(ConfigError, match="--nodes must be >= 1"):
        SlurmJob("tcp://10.0.0.1:5555", (), nodes=0)
    with pytest.raises(ConfigError, match="--sbatch takes one sbatch option such as --account=lab"):
        SlurmJob("tcp://10.0.0.1:5555", (), nodes=1, sbatch_options=("--account=lab\nrm -rf /",))


def test_flare2_learn_builds_its_learners_from_the_managers_recipe_and_names_what_it_cannot_build():
    from flare2.commands.learn import learner_plan
    from flare2.zoo.record import ActorCriticSettings
    from flare2.zoo.records.ppo import PPOConfig
    from flare2.zoo.registry import lookup

    build = lookup("ppo").builder("CartPole-v1", {}, PPOConfig(), ActorCriticSettings(), preprocessing=True)
    given = {
        "first_rank": 2,
        "count": 2,
        "learners": 4,
        "rendezvous": "tcp://10.0.0.1:29500",
        "timeout_s": 120.0,
        "rendezvous_timeout_s": 10.0,
        "device": "cpu",
        "seed": 3,
        "torch_threads": 1,
        "cts": [{"name": "RL", "build": build.recipe()}],
    }
    plan = learner_plan({"learners": given}, "tcp://10.0.0.1:5555")
    assert [(s.rank, s.learners, s.device, s.rendezvous) for s in plan] == [
        (2, 4, "cpu", "tcp://10.0.0.1:29500"),
        (3, 4, "cpu", "tcp://10.0.0.1:29500"),
    ]
    assert (plan[0].rendezvous_timeout_s, plan[0].group_timeout_s) == (10.0, 120.0)
    assert plan[0].cts[0].build == build
    elsewhere = {**given, "cts": [{"name": "RL", "build": {**build.recipe(), "algo": "my-ppo"}}]}
    with pytest.raises(ConfigError, match="the run's CT 'RL' cannot be built here: invalid choice: 'my-ppo'"):
        learner_plan({"learners": elsewhere}, "tcp://10.0.0.1:5555")
    with pytest.raises(ConfigError, match="answered with no valid learner recipe .* the same flare2 version"):
        learner_plan({"learners": {**given, "first_rank": 0}}, "tcp://10.0.0.1:5555")
