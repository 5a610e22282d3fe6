from setuptools import find_packages, setup

setup(
    name="flare2",
    version="0.1.0",
    description="A reinforcement-learning runtime: agent processes, ZeroMQ, batched ComputationTasks.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["flare2", "flare2.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.0",
        "numpy>=1.24",
        "pyzmq>=25",
        "msgpack>=1.0",
        "gymnasium>=0.29",
    ],
    extras_require={
        # The tests also cover flare2 plot, flare2 eval --video (as a .gif: no ffmpeg needed), --tensorboard, --wandb
        # (offline) and flare2 tune.
        "test": ["pytest>=7", "hypothesis>=6", "matplotlib>=3.7", "imageio>=2.30", "pygame>=2.1", "tensorboard>=2.10",
                 "wandb>=0.16", "optuna>=3.4"],
        # flare2 eval --video: frames to .gif (imageio with Pillow) or .mp4 (imageio-ffmpeg brings its own ffmpeg);
        # pygame draws the classic-control envs.
        "video": ["imageio>=2.30", "imageio-ffmpeg>=0.4", "pygame>=2.1"],
        # flare2 plot
        "plot": ["matplotlib>=3.7"],
        # --tensorboard: event files written through torch.utils.tensorboard, read by TensorBoard
        "tensorboard": ["tensorboard>=2.10"],
        # --wandb: the same scalars to Weights & Biases, through its TensorBoard sync
        "wandb": ["wandb>=0.16", "tensorboard>=2.10"],
        # flare2 tune: Optuna samples the settings and prunes trials
        "tune": ["optuna>=3.4"],
    },
    entry_points={"console_scripts": ["flare2=flare2.cli:main"]},
)
