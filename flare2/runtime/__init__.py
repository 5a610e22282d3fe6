"""The runtime, in folders by the process each file runs in.

- ``manager/``: the manager process (the run's control plane) and ``--serial``, which runs the same orchestration in
  one process. It starts the other roles, so it alone may import their entry points.
- ``compute/``: the compute process: CDPs, their sockets, the learners.
- ``agents/``: an agent process: the agent's sockets and its episode counters. Imports no torch.
- this folder: what every side shares (configs and options, exit codes, process plumbing, checkpoints, run files).

A role's folder imports only this folder and the layers below (``flare2.core``, ``flare2.wire``); the user commands
(``flare2.commands``) sit above all of it.
"""
