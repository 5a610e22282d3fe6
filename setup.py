from setuptools import find_packages, setup

setup(
    name="flare2",
    version="0.1.0",
    description="A reinforcement-learning runtime: agent processes, ZeroMQ, batched ComputationTasks.",
    long_description=(
        "flare2 is a reinforcement-learning runtime in the style of FLARE. Agent processes run episodes and send their "
        "prediction requests and experiences (over Unix streams on the manager's machine, over ZeroMQ from other "
        "machines) to a ComputationDataProcessor, which batches the requests of many agents into one forward pass (or "
        "one `learn()` call) of a ComputationTask on the CPU or GPU, then sends each agent its slice back. A Manager "
        "starts and supervises everything, prints progress and writes logs and checkpoints.\n\n"
        "The README and the docs/ folder of the repository have the install, the quickstart and the guides."
    ),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["flare2", "flare2.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",  # Adam's fused kernel on CPU (flare2.core.algorithm.adam)
        "numpy>=1.24",
        "pyzmq>=25",
        "msgpack>=1.0",
        "gymnasium>=0.29",
    ],
    extras_require={
        # The tests also cover flare2 plot, flare2 eval --video (as a .gif: no ffmpeg needed), --tensorboard, --wandb
        # (offline), flare2 tune, the docs site, Atari and MinAtar games, and the presets of Box2D and MuJoCo envs:
        # every optional package a default test uses, all from wheels.
        "test": [
            "pytest>=7",
            # two tests at a time: most of an integration test's time is its processes starting and waiting
            "pytest-xdist>=3.5",
            "hypothesis>=6",
            "matplotlib>=3.7",
            "imageio>=2.30",
            "pygame-ce>=2.4",
            "tensorboard>=2.10",
            "wandb>=0.16",
            "optuna>=3.4",
            "mkdocs>=1.6",
            "mkdocs-material>=9.5",
            "ale-py>=0.9",
            "opencv-python-headless>=4.10",
            "minatar>=1.0.15",
            "box2d>=2.3.10",
            "gymnasium[mujoco]>=1.0",
            "pettingzoo>=1.24",
            "mpe2>=1.1",
        ],
        # the checks .ci/run makes before the tests: pinned, so that a new release cannot fail an unchanged tree
        "lint": ["ruff==0.17.6", "mypy==2.4.1"],
        # the site of docs/: mkdocs serve, or mkdocs build --strict (which the tests run)
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5"],
        # flare2 eval --video: frames to .gif (imageio with Pillow) or .mp4 (imageio-ffmpeg brings its own ffmpeg);
        # pygame draws the classic-control envs (pygame-ce, the maintained fork that mpe2 needs: one package owns
        # the pygame module).
        "video": ["imageio>=2.30", "imageio-ffmpeg>=0.4", "pygame-ce>=2.4"],
        # flare2 plot
        "plot": ["matplotlib>=3.7"],
        # --tensorboard: event files written through torch.utils.tensorboard, read by TensorBoard
        "tensorboard": ["tensorboard>=2.10"],
        # --wandb: the same scalars to Weights & Biases, through its TensorBoard sync
        "wandb": ["wandb>=0.16", "tensorboard>=2.10"],
        # flare2 tune: Optuna samples the settings and prunes trials
        "tune": ["optuna>=3.4"],
        # Gymnasium's Box2D envs (LunarLander-v3, BipedalWalker-v3) import Box2D: the box2d wheel (gymnasium[box2d]
        # before 1.4 builds box2d-py from source with SWIG); pygame draws them. MuJoCo envs: HalfCheetah-v5, Hopper-v5...
        "box2d": ["box2d>=2.3.10", "pygame-ce>=2.4"],
        "mujoco": ["gymnasium[mujoco]>=1.0"],
        # Atari games (ALE/Breakout-v5...) with ale-py, which ships the ROMs; OpenCV resizes the frames to 84x84
        "atari": ["ale-py>=0.9", "opencv-python-headless>=4.10"],
        # MinAtar's small games (MinAtar/Breakout-v1...)
        "minatar": ["minatar>=1.0.15"],
        # multi-agent envs (flare2.core.pettingzoo_agent): PettingZoo, and MPE's envs (mpe2.simple_spread_v3...),
        # which draw with pygame-ce as PettingZoo's butterfly games (Knights-Archers-Zombies) do
        "pettingzoo": ["pettingzoo>=1.24", "mpe2>=1.1", "pygame-ce>=2.4"],
    },
    entry_points={"console_scripts": ["flare2=flare2.cli:main"]},
)
