"""A trained run's policies, loaded: ``flare2.load_policy(RUN_DIR)`` and ``load_policies``, which ``flare2 eval``
plays (``flare2.commands.evaluate``).

A run of ``flare2 train`` keeps what it takes to rebuild its policy:
``train.json`` (the algorithm, the env and every setting) and
``checkpoints/RL.pt`` (the weights, and the observation statistics of
``--normalize-observations``; a PettingZoo run with ``--policy-map`` has a
checkpoint per CT). A ``TrainedPolicy`` acts through the acting pipeline the
run's agents played with (``flare2.core.acting``): the same observation
transforms, the same trajectory views, the same model states carried from
step to step, Box actions clipped to the bounds. A ``PolicyPort`` is a
loaded ComputationTask in this process in place of a compute process, for an
agent that plays evaluation episodes over it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from flare2.core.acting import Acting
from flare2.core.env_making import env_spaces, is_pettingzoo_env, make_gym_env, make_pettingzoo_env
from flare2.core.envs import DEFAULT_CT
from flare2.core.pettingzoo_agent import policy_groups, policy_map
from flare2.core.transforms import RunningMoments, Transforms, statistics_shape
from flare2.errors import ConfigError, FlareError
from flare2.runtime.checkpoints import resume_checkpoint_path
from flare2.runtime.options import transform_options
from flare2.runtime.run_files import TRAIN_FILE
from flare2.zoo.registry import lookup, rebuild


class TrainedPolicy:
    """The CT of a ``flare2 train`` run, asked one observation at a time (Stable-Baselines3's ``model.predict``)::

        policy = flare2.load_policy("runs/ppo_CartPole-v1")
        env = policy.make_env()
        obs, _ = env.reset(seed=0)
        action = policy.predict(obs, episode_start=True)
        while True:
            obs, reward, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
            action = policy.predict(obs, reward=reward)

    ``reward`` is the env's reward of the step that led to ``obs``; only a model that sees previous rewards uses it.
    """

    def __init__(self, run: dict[str, Any], ct: Any, agents: tuple[str, ...] = ()) -> None:
        self.algo, self.env_id, self.ct, self.agents = run["algo"], run["env"], ct, agents
        self.env_kwargs = _env_kwargs(run)
        self.preprocessing = _preprocessing(run)
        """Whether the env is played with its published preprocessing (Atari's), as the run played it."""
        self.transforms = transform_options(run["run"])
        """The run's data transforms, as GymAgent's ``transforms`` option."""
        self.policy_map = run["run"].get("policy_map") or "shared"
        """Which CT acts for each agent of a PettingZoo env (``flare2 train --policy-map``)."""
        env = env_spaces(self.env_id, self.env_kwargs, preprocessing=self.preprocessing, agents=agents or None)
        self.observation_space, self.action_space = env.observation_space, env.action_space
        env.close()
        self._playing: dict[str | None, _Playing] = {}
        """What each agent plays with (the key None: the one of a Gymnasium env): its acting pipeline and last reply."""

    def make_env(self, **kwargs: Any) -> Any:
        """The run's env (with its time limit and preprocessing); ``kwargs`` go to ``gymnasium.make``
        (``render_mode="rgb_array"``). A PettingZoo env's game (its ``parallel_env`` or ``env``): ``predict`` takes
        the dict of its agents' observations."""
        if is_pettingzoo_env(self.env_id):
            return make_pettingzoo_env(self.env_id, {**self.env_kwargs, **kwargs})
        return make_gym_env(self.env_id, {**self.env_kwargs, **kwargs}, preprocessing=self.preprocessing)

    def predict(
        self,
        observation: Any,
        *,
        reward: float | Mapping[str, float] = 0.0,
        episode_start: bool = False,
        greedy: bool = True,
    ) -> Any:
        """The action for ``observation``, as the env takes it; ``greedy`` False samples as training did.

        In a PettingZoo env's game, ``observation`` is a dict of agents' observations (every live agent's, as
        ``reset()`` and ``step()`` of the parallel API give them; the one agent to move, ``{agent:
        env.observe(agent)}``, in a turn-based game) and ``reward`` the dict of their rewards: the answer is the dict
        of the actions of this policy's agents among them (``agents``; another CT's are left to its own policy). Each
        agent keeps its own model states and views; its first observation, and its first after
        ``episode_start=True``, starts its episode."""
        if self._by_agent(observation):
            if episode_start:
                self._playing.clear()
            rewards = reward if isinstance(reward, Mapping) else {}
            return {
                agent: self._act(agent, agent_observation, float(rewards.get(agent, 0.0)), greedy)
                for agent, agent_observation in observation.items()
                if agent in self.agents
            }
        if isinstance(reward, Mapping):
            raise ConfigError("predict() takes a dict of rewards with the dict of its agents' observations alone")
        if episode_start:
            self._playing.pop(None, None)
        elif None not in self._playing:
            raise ConfigError(
                "the first predict() of a policy needs episode_start=True: it starts the model's states and views"
            )
        return self._act(None, observation, float(reward), greedy)

    def _by_agent(self, observation: Any) -> bool:
        """Whether ``observation`` is a dict of a PettingZoo game's agents' observations (any other keys than one
        agent's Dict observation has; none when no agent is left) rather than one agent's."""
        if not (is_pettingzoo_env(self.env_id) and isinstance(observation, Mapping)):
            return False
        if not isinstance(self.observation_space, gym.spaces.Dict):
            return True
        return set(observation) != set(self.observation_space.spaces)

    def _act(self, agent: str | None, observation: Any, reward: float, greedy: bool) -> Any:
        playing = self._playing.get(agent)
        if playing is None:
            playing = self._playing[agent] = _Playing(self._new_acting())
            playing.acting.start([observation])
        else:
            acting = playing.acting
            rows = acting.next_rows()
            rows.set(0, observation)
            acting.stepped(rows, np.array([reward], acting.reward_dtype), *playing.reply)
        _, inputs, states = playing.acting.request()
        playing.reply = self.ct.predict(inputs, states, greedy=greedy)
        return playing.acting.env_actions(playing.reply[0])[0]

    def _new_acting(self) -> Acting:
        transforms = Transforms.from_options(self.transforms)
        transforms.bind(DEFAULT_CT, self.ct.specs, PolicyPort(self.ct))
        return Acting(
            specs=self.ct.specs,
            observation_space=self.observation_space,
            action_space=self.action_space,
            transforms=transforms,
            count=1,
            training=False,
        )


@dataclass
class _Playing:
    """One agent's play with a TrainedPolicy: its acting pipeline, and the reply to its last request."""

    acting: Acting
    reply: tuple[dict[str, Any], dict[str, Any]] = ({}, {})


class PolicyPort:
    """A CTPort over a ComputationTask loaded in this process: each request is answered as it is sent.

    Evaluation rows get the greedy action (with ``greedy`` False, every row is sampled as training did); the
    statistics of the data transforms are the checkpoint's. Nothing is learned: an agent that plays over it
    must be ``evaluating``, so that it stores nothing.
    """

    learn_ahead = 0

    def __init__(self, ct: Any, *, greedy: bool = True) -> None:
        self.ct, self.greedy = ct, greedy
        self._answered: dict[int, dict[str, Any]] = {}
        self._tickets = 0
        self._asked: list[str] = []

    def send_predict(self, payload: dict[str, Any]) -> int:
        evaluation = payload.get("evaluation")
        greedy = evaluation if self.greedy and evaluation is not None else False
        actions, states = self.ct.predict(payload["inputs"], payload["states"], greedy=greedy)
        self._tickets += 1
        self._answered[self._tickets] = {"actions": actions, "states": states, "version": self.ct.predicted_version}
        return self._tickets

    def wait_predict(self, ticket: int) -> dict[str, Any]:
        return self._answered.pop(ticket)

    def learn(self, payload: dict[str, Any]) -> None:
        raise FlareError(
            f"a loaded policy learns nothing: play it with an agent that is evaluating (CT {self.ct.name!r})"
        )

    def send_statistics(self, payload: dict[str, Any]) -> int:
        self._asked = list(payload["moments"])
        return 0

    def wait_statistics(self, ticket: int) -> dict[str, Any]:
        saved, specs = self.ct.statistics, self.ct.specs
        return {
            "moments": {
                key: saved.get(key, RunningMoments(statistics_shape(specs, key))).to_wire() for key in self._asked
            }
        }


def load_policy(path: str | Path, *, device: str = "cpu", ct: str = DEFAULT_CT) -> TrainedPolicy:
    """The policy of a ``flare2 train`` run: its log dir, or the checkpoint file in it; ``ct``: which of the run's
    CTs (a PettingZoo run with ``--policy-map`` has one per team or agent: ``load_policies`` gives them all)."""
    path = Path(path)
    run_dir, run = _read_run(path)
    by_ct = _agents_by_ct(run)
    if by_ct and ct not in by_ct and path.suffix != ".pt":
        raise ConfigError(
            f"{path} has no CT {ct!r}: its policy map made CTs {sorted(by_ct)} (load_policy(..., ct=NAME) loads one, "
            "load_policies all)"
        )
    agents = by_ct.get(ct, ())
    checkpoint = path if path.suffix == ".pt" else resume_checkpoint_path(run_dir, ct)
    return _load(run_dir / TRAIN_FILE, run, ct, tuple(agents), checkpoint, device)


def load_policies(path: str | Path, *, device: str = "cpu") -> dict[str, TrainedPolicy]:
    """Every CT's policy of a ``flare2 train`` run (its log dir), by CT name; given a checkpoint file, its CT's."""
    path = Path(path)
    if path.suffix == ".pt":
        return {path.stem: load_policy(path, device=device, ct=path.stem)}
    run_dir, run = _read_run(path)
    cts = _agents_by_ct(run) or {DEFAULT_CT: []}
    return {
        ct: _load(run_dir / TRAIN_FILE, run, ct, tuple(agents), resume_checkpoint_path(run_dir, ct), device)
        for ct, agents in cts.items()
    }


def _read_run(path: Path) -> tuple[Path, dict[str, Any]]:
    """The run dir of ``path`` (a log dir, or a checkpoint in it) and its ``train.json``, checked."""
    run_dir = path.parent.parent if path.suffix == ".pt" else path
    train_file = run_dir / TRAIN_FILE
    if not train_file.is_file():
        raise ConfigError(
            f"{path} is no run of flare2 train: {train_file} is missing (give the log dir of a flare2 train run, or "
            "its checkpoints/RL.pt)"
        )
    try:
        run = json.loads(train_file.read_text(encoding="utf-8"))
        missing = {"algo", "env", "algorithm", "agent", "run"} - set(run)
        if missing:
            raise KeyError(f"no {sorted(missing)}")
    except (ValueError, KeyError, TypeError) as exc:
        raise _not_as_written(train_file, exc) from None
    return run_dir, run


def _agents_by_ct(run: dict[str, Any]) -> dict[str, list[str]]:
    """Each CT's agents in a PettingZoo run, by its policy map; empty for a Gymnasium env's run."""
    if not is_pettingzoo_env(run["env"]):
        return {}
    env = make_pettingzoo_env(run["env"], _env_kwargs(run))
    agents = list(env.possible_agents)
    env.close()
    # A self-play run has no policy map: its learner, CT RL, plays every seat (its frozen copy only opposed it).
    return policy_groups(agents, policy_map(agents, run["run"].get("policy_map") or "shared").__getitem__)


def _load(
    train_file: Path, run: dict[str, Any], name: str, agents: tuple[str, ...], checkpoint: Path, device: str
) -> TrainedPolicy:
    recipe = {
        "algo": run["algo"],
        "env": run["env"],
        "env_kwargs": _env_kwargs(run),
        "algorithm": run["algorithm"],
        "agent": run["agent"],
        "preprocessing": _preprocessing(run),
        "agents": list(agents),
    }
    try:
        lookup(run["algo"])
    except ConfigError as exc:  # an algorithm of a package this Python lacks: the message names how one is added
        raise ConfigError(f"{train_file} is a run of algo {run['algo']!r}: {exc}") from None
    try:
        build = rebuild(recipe)
    except ConfigError as exc:
        raise _not_as_written(train_file, exc) from None

    from flare2.core.computation_task import ComputationTask

    ct = ComputationTask(name, build(), device=device)
    ct.load(checkpoint)
    return TrainedPolicy(run, ct, agents)


def _not_as_written(train_file: Path, exc: Exception) -> ConfigError:
    return ConfigError(f"{train_file} is not as flare2 train writes it ({exc!r}): was it edited by hand?")


def _env_kwargs(run: dict[str, Any]) -> dict[str, Any]:
    steps = run["run"].get("max_episode_steps")
    return {"max_episode_steps": steps} if steps else {}


def _preprocessing(run: dict[str, Any]) -> bool:
    return bool(run["run"].get("env_preprocessing", True))
