"""Agent processes and the manager stay small: what they import must not pull in torch (docs/architecture.md: What the hot path costs: about 140 MB
each); only the compute process (and its learner process) loads it."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import sys
import flare2
import flare2.runtime.agents.agent_process
import flare2.runtime.manager.manager
import flare2.commands.attach
import flare2.commands.train
import flare2.runtime.options
import flare2.zoo.registry
flare2.zoo.registry.names()  # imports every zoo record
import flare2.core.envs
import flare2.core.helpers
# The lazy package exports that agents use must not pull torch in either.
flare2.Spec, flare2.CTSpecs, flare2.Agent, flare2.AgentHelper, flare2.OnlineHelper, flare2.GymAgent
loaded = sorted(name for name in sys.modules if name == "torch" or name.startswith("torch."))
print(",".join(loaded))
sys.exit(1 if loaded else 0)
"""


def test_importing_the_agent_side_and_the_manager_of_flare2_does_not_import_torch():
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"torch modules imported: {result.stdout.strip()}\n{result.stderr}"
