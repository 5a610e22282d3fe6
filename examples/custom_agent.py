"""Write your own Model, Algorithm and Agent: a one-step actor-critic learns to walk a corridor.

    python examples/custom_agent.py --num-agents 4 --max-episodes 3000

The Agent and its environment are in corridor_agent.py. The corridor has 10
cells; each step costs -0.01 and reaching the right end gives +1 and terminates. After 50 steps the episode is truncated (a random
walk rarely gets there in time). Always walking right earns 0.92.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

# The Agent lives in its own module, because agent processes must not import torch.
from corridor_agent import CELLS
from torch import nn
from torch.nn import functional as F

from flare2 import AgentConfig, Algorithm, CTConfig, Manager, Model, RunConfig, Spec

AGENT_PATH = f"{Path(__file__).with_name('corridor_agent.py')}:CorridorAgent"


# 1. The Model: a network plus the specs of what it takes and gives (no batch dimension).
class CorridorNet(Model):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(CELLS, 32), nn.Tanh())
        self.logits = nn.Linear(32, 2)
        self.value = nn.Linear(32, 1)

    def input_specs(self):
        return {"position": Spec((CELLS,), "float32")}

    def action_specs(self):
        return {"move": Spec((), "int64")}

    def forward(self, position: torch.Tensor):
        hidden = self.body(position)
        return self.logits(hidden), self.value(hidden).squeeze(-1)


# 2. The Algorithm: predict() on [B, ...] batches, learn() on [B, T, ...] experiences.
class OneStepActorCritic(Algorithm):
    def __init__(self, model: CorridorNet, lr: float = 0.01, gamma: float = 0.97) -> None:
        super().__init__(model, max_grad_norm=1.0)
        self.gamma = gamma
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def predict(self, inputs, states):
        logits, _ = self.model(inputs["position"])
        return {"move": torch.multinomial(F.softmax(logits, -1), 1).squeeze(-1)}, {}

    def learn(self, experience):
        logits, values = self.model(experience.inputs["position"])
        with torch.no_grad():
            _, next_values = self.model(experience.next_inputs["position"])
            # A termination ends the return; a truncation still bootstraps (docs/architecture.md: Episode edges).
            targets = experience.rewards["reward"] + self.gamma * next_values * (~experience.terminated)
        advantages = (targets - values).detach()
        log_probs = F.log_softmax(logits, -1).gather(-1, experience.actions["move"].unsqueeze(-1)).squeeze(-1)
        loss = -(log_probs * advantages).mean() + 0.5 * F.mse_loss(values, targets)
        return {"loss": loss.item(), "grad_norm": self.optimize(loss)}


def build_algorithm() -> OneStepActorCritic:
    return OneStepActorCritic(CorridorNet())


# 3. The manager script: one CT named "walker", the agents named by import path.
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-agents", type=int, default=4, help="agent processes")
    parser.add_argument("--max-episodes", type=int, default=3000, help="stop after this many episodes")
    parser.add_argument("--log-dir", default="runs/corridor", help="where progress.csv and checkpoints go")
    parser.add_argument("--serial", action="store_true", help="everything in this process, for a debugger (one agent)")
    args = parser.parse_args(argv)
    config = RunConfig(
        cts=(CTConfig(name="walker", build=build_algorithm),),
        agents=AgentConfig(path=AGENT_PATH, num_agents=args.num_agents),  # an Agent: one env each
        log_dir=args.log_dir,
        max_episodes=args.max_episodes,
        stop_return=0.85,
        device="cpu",
        progress_interval_s=2.0,
        serial=args.serial,
    )
    return Manager(config).run()


if __name__ == "__main__":
    sys.exit(main())
