"""Encoders: what the zoo's models put between an observation and their heads, chosen from the observation space.

A vector (a Box of floats, or a Discrete state one-hot encoded) is flattened; an
image (a Box of ``uint8`` or ``bool`` with two or three dims) goes through a CNN
on the compute device, where ``uint8`` pixels become floats in [0, 1]: they
cross from the env to the device as bytes, a quarter of float32's size.

The CNNs (``--encoder``):

- ``nature``: Mnih et al.'s "Human-level control through deep reinforcement
  learning" (Nature, 2015) network, 32-64-64 convolutions and 512 features, as
  CleanRL's ``ppo_atari`` and SB3's ``NatureCNN`` build it: Atari's 84x84 frames.
- ``impala``: the residual encoder of Espeholt et al.'s IMPALA (ICML 2018),
  three stacks of 16, 32, 32 channels, 256 features: larger or more varied
  scenes (Procgen, DMLab) at about 3x the compute of ``nature``.
- ``minatar``: Young and Tian's MinAtar network (2019), one 3x3 convolution of
  16 channels and 128 features, for images too small for ``nature``'s 8x8
  stride-4 first layer (MinAtar's 10x10).

``auto`` takes ``nature`` for images of at least 36 pixels a side (the least
its three layers take) and ``minatar`` below. ``flat`` takes no CNN: the pixels
are flattened into the model's MLPs, as gymnax's MinAtar baselines do.

A frame stack is a trajectory view of the last ``frames`` observations
(``View.last_observations``): its frames become channels, so a stack of four
84x84 grayscale frames is the Nature network's 4-channel input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from flare2.errors import ConfigError

ENCODERS = ("auto", "nature", "impala", "minatar", "flat")
"""What ``--encoder`` takes: the CNN of an image observation (``auto`` picks one from its size; ``flat``: none)."""

_NATURE_LEAST_SIDE = 36
"""The smallest side the Nature network's three layers take (8x8 stride 4, 4x4 stride 2, 3x3 stride 1)."""


@dataclass(frozen=True)
class ImageLayout:
    """Where an image observation keeps its channels: ``channels`` of ``height`` x ``width``, first or last."""

    channels: int
    height: int
    width: int
    channels_last: bool
    has_channel_dim: bool
    pixel_scale: float = 1.0
    """What one unit of a pixel is worth to the network: 1/255 for ``uint8`` (to [0, 1]), 1 for ``bool``."""

    @property
    def dims(self) -> int:
        """The dims of one observation: 2 for a grayscale image without a channel dim, else 3."""
        return 3 if self.has_channel_dim else 2


def image_layout(space: gym.Space) -> ImageLayout | None:
    """The layout of an image observation space; None for any other.

    An image is a Box of ``uint8`` or ``bool`` with two dims (one channel) or
    three, whose channels are the last dim (Gymnasium's and ALE's layout)
    unless the first is smaller (a channels-first image such as ``(3, 64, 64)``).
    """
    if not isinstance(space, gym.spaces.Box) or space.dtype not in (np.uint8, np.bool_):
        return None
    shape = tuple(int(size) for size in space.shape)
    scale = 1 / 255 if space.dtype == np.uint8 else 1.0
    if len(shape) == 2:
        return ImageLayout(1, shape[0], shape[1], channels_last=True, has_channel_dim=False, pixel_scale=scale)
    if len(shape) != 3:
        return None
    if shape[0] < shape[-1]:
        return ImageLayout(shape[0], shape[1], shape[2], channels_last=False, has_channel_dim=True, pixel_scale=scale)
    return ImageLayout(shape[2], shape[0], shape[1], channels_last=True, has_channel_dim=True, pixel_scale=scale)


def _conv(conv: nn.Conv2d) -> nn.Conv2d:
    nn.init.orthogonal_(conv.weight, math.sqrt(2))
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    return conv


class _InputScaledConv2d(nn.Conv2d):
    """A CNN's first convolution, over pixels worth ``input_scale`` each: the scale multiplies its few weights, not
    the many pixels (dividing each minibatch of frames by 255 was about 5 % of a Nature CNN update on 2 cores). Its
    weights and their gradients are those of the same convolution over the scaled pixels."""

    def __init__(self, input_scale: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.input_scale = input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scale == 1.0:
            return super().forward(x)
        return self._conv_forward(x, self.weight * self.input_scale, self.bias)


def _linear(fan_in: int, fan_out: int) -> nn.Linear:
    linear = nn.Linear(fan_in, fan_out)
    nn.init.orthogonal_(linear.weight, math.sqrt(2))
    nn.init.zeros_(linear.bias)
    return linear


class _Residual(nn.Module):
    """IMPALA's residual block: x + conv(relu(conv(relu(x))))."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.first = _conv(nn.Conv2d(channels, channels, 3, padding=1))
        self.second = _conv(nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(torch.relu(self.first(torch.relu(x))))


def _impala_stack(channels_in: int, channels: int, pixel_scale: float = 1.0) -> nn.Sequential:
    return nn.Sequential(
        _conv(_InputScaledConv2d(pixel_scale, channels_in, channels, 3, padding=1)),
        nn.MaxPool2d(3, stride=2, padding=1),
        _Residual(channels),
        _Residual(channels),
    )


def _cnn(kind: str, channels: int, pixel_scale: float) -> nn.Sequential:
    """The convolutional part of encoder ``kind`` (no flatten, no linear layer), over pixels worth ``pixel_scale``."""
    if kind == "nature":
        return nn.Sequential(
            _conv(_InputScaledConv2d(pixel_scale, channels, 32, 8, stride=4)),
            nn.ReLU(),
            _conv(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            _conv(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
        )
    if kind == "impala":
        return nn.Sequential(
            _impala_stack(channels, 16, pixel_scale), _impala_stack(16, 32), _impala_stack(32, 32), nn.ReLU()
        )
    return nn.Sequential(_conv(_InputScaledConv2d(pixel_scale, channels, 16, 3, stride=1)), nn.ReLU())


_FEATURES = {"nature": 512, "impala": 256, "minatar": 128}


def encoder_kind(layout: ImageLayout, kind: str = "auto") -> str:
    """The CNN ``--encoder kind`` gives images of ``layout``: ``auto`` is the Nature network from 36 pixels a side,
    MinAtar's below."""
    if kind != "auto":
        return kind
    return "nature" if min(layout.height, layout.width) >= _NATURE_LEAST_SIDE else "minatar"


class ImageEncoder(nn.Module):
    """A CNN from ``[..., frames, *image]`` observations (``uint8`` or ``bool``) to ``features`` floats each.

    The frames of a stack and the channels of each frame become the channels of
    one image; ``uint8`` pixels are worth 1/255 each (in [0, 1]) to the first convolution, on the device.
    """

    def __init__(self, layout: ImageLayout, kind: str = "auto", *, frames: int = 1) -> None:
        super().__init__()
        if kind not in ENCODERS:
            raise ConfigError(f"--encoder {kind!r} is no image encoder: use one of {', '.join(ENCODERS)}")
        if kind == "flat":
            raise ConfigError("--encoder flat flattens the image into the MLPs: the model makes no ImageEncoder then")
        side = min(layout.height, layout.width)
        kind = encoder_kind(layout, kind)
        if kind == "nature" and side < _NATURE_LEAST_SIDE:
            raise ConfigError(
                f"--encoder nature takes images of at least {_NATURE_LEAST_SIDE} pixels a side, the observations are "
                f"{layout.height}x{layout.width}: use --encoder minatar or impala"
            )
        self.kind = kind
        self.layout = layout
        self.frames = frames
        channels = layout.channels * frames
        # Channels-last convolutions run faster on the CPU (oneDNN's layout: 1.4x a Nature CNN update) and on GPUs.
        self.cnn = _cnn(kind, channels, layout.pixel_scale).to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # not in torch's stubs
        with torch.no_grad():
            flat = self.cnn(torch.zeros(1, channels, layout.height, layout.width)).numel()
        self.features = _FEATURES[kind]
        self.head = nn.Sequential(nn.Flatten(), _linear(flat, self.features), nn.ReLU())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        """``[..., *image]`` (one frame) or ``[..., frames, *image]`` to ``[..., features]``."""
        layout = self.layout
        image_dims = layout.dims + (self.frames > 1)
        batch = observations.shape[: observations.dim() - image_dims]
        x = observations.reshape(-1, *observations.shape[observations.dim() - image_dims :])
        if not layout.has_channel_dim:
            x = x.unsqueeze(-1)  # [N, (frames,) H, W, 1]
        if self.frames == 1:
            x = x.unsqueeze(1)  # [N, 1, ...]
        if layout.channels_last:
            x = x.movedim(-1, 2)  # [N, frames, C, H, W]
        # One copy makes the floats (the weights' kind) and their layout; the first convolution scales the pixels
        # (_InputScaledConv2d).
        floats = next(self.head.parameters()).dtype
        x = x.reshape(x.shape[0], -1, layout.height, layout.width).to(floats, memory_format=torch.channels_last)
        return self.head(self.cnn(x)).reshape(*batch, self.features)
