"""Two ComputationTasks per agent that share a network body: a policy (A2C) and an auxiliary predictor.

    python examples/cartpole_multi_ct.py --num-agents 8 --max-steps 200000 --log-dir runs/multi_ct

CT "policy" is A2C on CartPole; CT "aux" learns to predict whether the
episode ends at the next step. The policy head and the predictor's head sit
on one MLP body: the policy trains it, and the predictor's head learns from
the features it makes. The two CTs live in the one compute process (they
share parameters), each with its own CDP, batching and learn calls;
learn.csv has the costs of both and cts.csv how each CT's requests batched
across the agents (`python tools/ct_report.py LOG_DIR`).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from flare2 import Algorithm, Model, Spec
from flare2.core.env_making import make_gym_env
from flare2.runtime.config import CTConfig
from flare2.runtime.manager.manager import Manager
from flare2.runtime.options import (
    add_config_options,
    add_run_options,
    batching_from_args,
    config_from_args,
    run_config_from_args,
)
from flare2.zoo.a2c import A2C
from flare2.zoo.models import ActorCritic, mlp
from flare2.zoo.records.a2c import A2CConfig

AGENT_PATH = f"{Path(__file__).with_name('multi_ct_agent.py')}:PolicyAndAuxAgent"
_shared: dict[str, nn.Module] = {}


# 1. The shared body: both build functions run in the one compute process, so they get the same module.
def shared_body() -> nn.Module:
    if "body" not in _shared:
        _shared["body"] = nn.Sequential(mlp([4, 64, 64]), nn.Tanh())
    return _shared["body"]


# 2. The policy: the stock actor-critic with its policy head on the shared body. The value network
#    keeps its own layers: on the shared body too, its regression gradients swamped the policy's
#    (return_mean 138 after 200k steps).
class SharedBodyActorCritic(ActorCritic):
    def __init__(self) -> None:
        env = make_gym_env("CartPole-v1")
        super().__init__(env.observation_space, env.action_space)
        self.body = shared_body()
        self.policy_net = mlp([64, 2], out_gain=0.01)

    def policy(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.policy_net(self.body(inputs["obs"]))


# 3. The auxiliary task: the probability that the episode ends after this step.
class EndPredictor(Model):
    def __init__(self) -> None:
        super().__init__()
        self.body = shared_body()
        self.head = mlp([64, 1])

    def input_specs(self):
        return {"obs": Spec((4,), "float32")}

    def action_specs(self):
        return {"p_end": Spec((), "float32")}

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # detach: the policy's optimizer alone trains the body, so no gradient is spent on it here.
        return self.head(self.body(obs).detach()).squeeze(-1)


class EndPrediction(Algorithm):
    def __init__(self, model: EndPredictor, lr: float = 1e-3) -> None:
        super().__init__(model, max_grad_norm=1.0)
        # Only the head: two optimizers on one body would fight over its Adam moments.
        self.optimizer = torch.optim.Adam(model.head.parameters(), lr=lr)

    def predict(self, inputs, states):
        return {"p_end": torch.sigmoid(self.model(inputs["obs"]))}, {}

    def learn(self, experience):
        logits = self.model(experience.inputs["obs"])
        loss = F.binary_cross_entropy_with_logits(logits, experience.terminated.float())
        return {"bce": loss.item(), "grad_norm": self.optimize(loss)}


def build_policy(config: A2CConfig) -> A2C:
    return A2C(SharedBodyActorCritic(), config)


def build_aux(lr: float) -> EndPrediction:
    return EndPrediction(EndPredictor(), lr=lr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aux-lr", type=float, default=1e-3, help="Adam learning rate of the end predictor's head")
    add_config_options(parser, A2CConfig)
    add_run_options(parser, num_agents=8, envs_per_agent=1, max_steps=200_000, log_dir="runs/cartpole_multi_ct")
    args = parser.parse_args(argv)
    # 4. Two CTs, each with its own CDP and batching; one agent class asks both.
    cts = [
        CTConfig(
            name="policy",
            build=partial(build_policy, config_from_args(parser, args, A2CConfig)),
            batching=batching_from_args(args),
        ),
        CTConfig(name="aux", build=partial(build_aux, args.aux_lr), batching=batching_from_args(args)),
    ]
    run = run_config_from_args(parser, args, cts=cts, agent_path=AGENT_PATH, agent_kwargs={"env_id": "CartPole-v1"})
    return Manager(run).run()


if __name__ == "__main__":
    sys.exit(main())
