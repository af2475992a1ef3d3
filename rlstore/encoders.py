"""Observation encoders: one per observation space, each mapping a batch of observations as
the env gives them (and the storage keeps them: integers stay integers, images uint8) to
float features of a fixed width, `out_dim`, on which an algorithm's torso and heads sit.

    Box (vectors, any shape)   flattened                       FlatEncoder
    MultiBinary                flattened, as floats            FlatEncoder
    Discrete(n)                one-hot of width n              OneHotEncoder
    MultiDiscrete(nvec)        one-hots, concatenated          OneHotEncoder
    uint8 images (3 dims)      a CNN, scaled inside            ImageEncoder
    Dict, Tuple of those       one encoder per part, their     CombinedEncoder
                               features concatenated

A network holds its encoder as `self.encoder`; model.pt keeps the space it was built for
(`describe_space`), from which `encoder_from_description` rebuilds it. The encoders
without parameters have a numpy twin, `host(obs)`, which the numpy fast paths use.

A new observation space is one encoder here, its entry in `encoder_for` and
`describe_space`, and its tests (tests/test_encoders.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

# Frame stacks of at least this size take the Nature CNN; smaller images (MiniGrid's 7x7)
# vanish in its 8x8 stride-4 convolution and take a CNN of 2x2 convolutions instead.
NATURE_CNN_MIN_SIZE = 36
SMALL_CNN_CHANNELS = (16, 32, 64)
# What an image's values are divided by when a model file predates the choice (ImageOptions).
PIXEL_SCALE = 255.0


@dataclass(frozen=True)
class ImageOptions:
    """How uint8 images are encoded (--cnn-channels, --image-scale): `channels` of the small
    CNN's convolutions; `scale`, what the values are divided by inside the network. "auto":
    255 for images the Nature CNN takes (pixels), 1 for the small CNN's grids, whose values
    are symbols (MiniGrid's object, colour and state indices, 0-10, which rl-starter-files
    feeds unscaled: divided by 255 they are too small to learn from, MiniGrid-Unlock-v0 is
    not learnt in 150k steps)."""

    channels: tuple[int, ...] = SMALL_CNN_CHANNELS
    scale: float | str = "auto"

    def scale_for(self, nature: bool) -> float:
        """The scale of an image that takes the Nature CNN (`nature`) or the small one."""
        if self.scale == "auto":
            return PIXEL_SCALE if nature else 1.0
        return float(self.scale)


DEFAULT_IMAGES = ImageOptions()


class FlatEncoder(nn.Module):
    """Box observations of any shape, and MultiBinary ones: flattened, as float32."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.out_dim = int(np.prod(shape, dtype=np.int64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).float()

    def host(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)


class OneHotEncoder(nn.Module):
    """Discrete observations (`nvec` = (n,), values start..start + n - 1) and
    MultiDiscrete ones (one value per entry of `nvec`, each in [start, start + n)): the
    one-hot of each value, concatenated in the order of the flattened `nvec`."""

    def __init__(self, nvec: tuple[int, ...], start: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.nvec = np.asarray(nvec, dtype=np.int64).reshape(-1)
        starts = np.zeros_like(self.nvec) if start is None else np.asarray(start).reshape(-1)
        # value v of entry i is column offset[i] + v - start[i] of the concatenated one-hots
        offsets = np.concatenate(([0], np.cumsum(self.nvec)[:-1])) - starts
        self.register_buffer(
            "offsets", torch.as_tensor(offsets, dtype=torch.int64), persistent=False
        )
        self._host_offsets = offsets
        self.out_dim = int(self.nvec.sum())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        columns = obs.reshape(obs.shape[0], -1).long() + self.offsets
        out = torch.zeros(obs.shape[0], self.out_dim, device=obs.device)
        return out.scatter_(1, columns, 1.0)

    def host(self, obs: np.ndarray) -> np.ndarray:
        columns = np.asarray(obs, dtype=np.int64).reshape(len(obs), -1) + self._host_offsets
        out = np.zeros((len(obs), self.out_dim), dtype=np.float32)
        out[np.arange(len(obs))[:, None], columns] = 1.0  # (put_along_axis costs twice this)
        return out


class CombinedEncoder(nn.Module):
    """Dict and Tuple observations (nested too): one encoder per part, their features
    concatenated in the space's order (SB3's CombinedExtractor). The observations come as
    the env batches them: a dict (Dict) or a tuple (Tuple) of the parts' batches."""

    def __init__(self, parts: dict[str, nn.Module] | list[nn.Module]) -> None:
        super().__init__()
        self.keys = list(parts) if isinstance(parts, dict) else list(range(len(parts)))
        encoders = parts.values() if isinstance(parts, dict) else parts
        self.parts = nn.ModuleDict({str(k): e for k, e in zip(self.keys, encoders, strict=True)})
        self.out_dim = sum(e.out_dim for e in self.parts.values())

    def forward(self, obs: Any) -> torch.Tensor:
        return torch.cat([self.parts[str(k)](obs[k]) for k in self.keys], dim=1)


class HostCombinedEncoder(CombinedEncoder):
    """A CombinedEncoder of parameter-free parts, with their numpy twin."""

    def host(self, obs: Any) -> np.ndarray:
        return np.concatenate([self.parts[str(k)].host(obs[k]) for k in self.keys], axis=1)


def image_layout(shape: tuple[int, ...]) -> str:
    """ "channels_first" (C, H, W) or "channels_last" (H, W, C) for a 3-d image shape: the
    channels are the smaller of the two ends (MiniGrid's (7, 7, 3), Atari's (4, 84, 84));
    a tie reads as channels last, as most image envs give them."""
    return "channels_first" if shape[0] < shape[-1] else "channels_last"


def channels_height_width(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of a 3-d image shape in either layout."""
    if image_layout(shape) == "channels_last":
        return shape[2], shape[0], shape[1]
    return shape[0], shape[1], shape[2]


def takes_nature_cnn(shape: tuple[int, ...]) -> bool:
    """Whether an image of this shape takes the Nature CNN (else the small one)."""
    return min(channels_height_width(shape)[1:]) >= NATURE_CNN_MIN_SIZE


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std` and a constant bias (the PPO implementation detail)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class ScaleFrames(nn.Module):
    """uint8 values -> floats divided by `scale` (pixels by 255: in [0, 1]), channels-last
    as the convolutions, inside the network."""

    def __init__(self, scale: float = PIXEL_SCALE) -> None:
        super().__init__()
        self.scale = float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() if self.scale == 1.0 else x.float() / self.scale
        return x.contiguous(memory_format=torch.channels_last)


def nature_cnn(
    in_channels: int, frame_shape: tuple[int, int], scale: float = PIXEL_SCALE
) -> nn.Sequential:
    """The Nature DQN trunk (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1, 512 linear,
    ReLU, orthogonal init with gain sqrt(2) as in the PPO reference. Takes uint8 frame stacks
    and scales them to [0, 1] itself, so they stay uint8 in storage and on the way here."""
    convs = nn.Sequential(
        layer_init(nn.Conv2d(in_channels, 32, 8, stride=4)),
        nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)),
        nn.ReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)),
        nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        flat = convs(torch.zeros(1, in_channels, *frame_shape)).shape[1]
    # Channels-last convolutions: forward and backward of a 256-frame-stack minibatch take
    # about 1.5x less time on a CPU (oneDNN), and cuDNN prefers the layout too.
    convs = convs.to(memory_format=torch.channels_last)
    head = [layer_init(nn.Linear(flat, 512)), nn.ReLU()]
    return nn.Sequential(ScaleFrames(scale), *convs, *head)


def small_cnn(
    in_channels: int,
    frame_shape: tuple[int, ...],
    channels: tuple[int, ...] = SMALL_CNN_CHANNELS,
    scale: float = 1.0,
) -> nn.Sequential:
    """2x2 convolutions, stride 1, ReLU after each, then flattened: for grids such as
    MiniGrid's 7x7 views (the CNN of its reference PPO, rl-starter-files, without the max
    pooling, which a 7x7 grid cannot spare)."""
    layers: list[nn.Module] = [ScaleFrames(scale)]
    for width in channels:
        layers += [layer_init(nn.Conv2d(in_channels, width, 2)), nn.ReLU()]
        in_channels = width
    layers.append(nn.Flatten())
    return nn.Sequential(*layers)


class ImageEncoder(nn.Module):
    """uint8 images with three dimensions, channels first or last: the Nature CNN from 36
    pixels a side up, the small CNN below that; scaled inside (uint8 all the way to here)
    as `options` say."""

    def __init__(self, shape: tuple[int, ...], options: ImageOptions = DEFAULT_IMAGES) -> None:
        super().__init__()
        self.channels_last = image_layout(shape) == "channels_last"
        c, h, w = channels_height_width(shape)
        if min(h, w) < 2:
            raise ValueError(f"an image of {shape} is too small for a CNN")
        nature = takes_nature_cnn(shape)
        self.scale = options.scale_for(nature)
        if nature:
            self.cnn = nature_cnn(c, (h, w), self.scale)
        else:
            self.cnn = small_cnn(c, (h, w), tuple(options.channels), self.scale)
        with torch.no_grad():
            self.out_dim = int(self.cnn(torch.zeros(1, c, h, w, dtype=torch.uint8)).shape[1])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            obs = obs.permute(0, 3, 1, 2)
        return self.cnn(obs)


def is_image(space: gym.Space) -> bool:
    """uint8 Box observations with three dimensions (channels first or last)."""
    return isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def has_image(space: gym.Space) -> bool:
    """Whether the observations are images, or hold one as a part (Dict, Tuple)."""
    if isinstance(space, (spaces.Dict, spaces.Tuple)):
        return any(has_image(part) for part in _parts(space).values())
    return is_image(space)


def _parts(space: spaces.Dict | spaces.Tuple) -> dict[Any, gym.Space]:
    return dict(space.spaces) if isinstance(space, spaces.Dict) else dict(enumerate(space))


# -- spaces <-> descriptions <-> encoders ------------------------------------------------------


class UnsupportedSpace(ValueError):
    """An observation space rlstore cannot encode; its message says which and why,
    `part` where it sits in a Dict or Tuple ("" for the whole space)."""

    def __init__(self, message: str, part: str = "") -> None:
        super().__init__(message)
        self.part = part


def stored_dtype(space: gym.Space) -> Any:
    """The dtype observations of `space` are stored in: float vectors as float32, the
    rest (integers, uint8 images, binary) in their own dtype; for Dict and Tuple spaces a
    dict or tuple of the parts' (rlstore/parts.py)."""
    if isinstance(space, spaces.Dict):
        return {k: stored_dtype(part) for k, part in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(stored_dtype(part) for part in space)
    dtype = np.dtype(space.dtype)
    return np.dtype(np.float32) if dtype.kind == "f" else dtype


def stored_shape(space: gym.Space) -> Any:
    """The shape of one observation of `space`; for Dict and Tuple spaces a dict or tuple
    of the parts' (rlstore/parts.py)."""
    if isinstance(space, spaces.Dict):
        return {k: stored_shape(part) for k, part in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(stored_shape(part) for part in space)
    return tuple(space.shape)


def describe_space(
    space: gym.Space, name: str = "", images: ImageOptions = DEFAULT_IMAGES
) -> dict[str, Any]:
    """A JSON-able description of an observation space, which model.pt keeps and
    `encoder_from_description` reads. `name`: where the space sits in a Dict or Tuple
    (for the message of a part rlstore cannot encode); `images`: how images are encoded."""
    if isinstance(space, spaces.Dict):
        parts = {
            k: describe_space(part, f"{name}[{k!r}]", images) for k, part in space.spaces.items()
        }
        return {"type": "dict", "parts": parts}
    if isinstance(space, spaces.Tuple):
        parts = [describe_space(part, f"{name}[{i}]", images) for i, part in enumerate(space)]
        return {"type": "tuple", "parts": parts}
    if isinstance(space, spaces.Discrete):
        return {"type": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "multi_discrete",
            "nvec": space.nvec.tolist(),
            "start": np.broadcast_to(space.start, space.nvec.shape).tolist(),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "multi_binary", "shape": list(space.shape)}
    if isinstance(space, spaces.Box):
        if not is_image(space):
            return {"type": "box", "shape": list(space.shape), "dtype": str(space.dtype)}
        scale = images.scale_for(takes_nature_cnn(tuple(space.shape)))
        return {
            "type": "image",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "channels": list(images.channels),
            "scale": scale,
        }
    where = f"the observation's part {name}" if name else "the observation space"
    raise UnsupportedSpace(
        f"{where} is {space} ({type(space).__name__}), which rlstore cannot encode", name
    )


def described_shape(description: dict[str, Any]) -> Any:
    """The shape of one observation of a described space (a tree of shapes for Dict
    and Tuple spaces, rlstore/parts.py)."""
    kind = description["type"]
    if kind == "dict":
        return {k: described_shape(d) for k, d in description["parts"].items()}
    if kind == "tuple":
        return tuple(described_shape(d) for d in description["parts"])
    if kind == "discrete":
        return ()
    if kind == "multi_discrete":
        return tuple(np.shape(description["nvec"]))
    return tuple(description["shape"])


def encoder_from_description(description: dict[str, Any]) -> nn.Module:
    """The encoder of a described observation space (describe_space)."""
    kind = description["type"]
    if kind in ("dict", "tuple"):
        parts = description["parts"]
        encoders = (
            {k: encoder_from_description(d) for k, d in parts.items()}
            if kind == "dict"
            else [encoder_from_description(d) for d in parts]
        )
        values = encoders.values() if kind == "dict" else encoders
        host = all(hasattr(e, "host") for e in values)
        return (HostCombinedEncoder if host else CombinedEncoder)(encoders)
    if kind == "discrete":
        return OneHotEncoder((description["n"],), (description["start"],))
    if kind == "multi_discrete":
        return OneHotEncoder(tuple(np.ravel(description["nvec"])), description["start"])
    if kind == "image":  # (model files older than "channels" and "scale": the defaults then)
        channels = tuple(description.get("channels", SMALL_CNN_CHANNELS))
        options = ImageOptions(channels, description.get("scale", PIXEL_SCALE))
        return ImageEncoder(tuple(description["shape"]), options)
    if kind in ("box", "multi_binary"):
        return FlatEncoder(tuple(description["shape"]))
    raise ValueError(f"unknown observation description {description}")


def encoder_for(space: gym.Space, images: ImageOptions = DEFAULT_IMAGES) -> nn.Module:
    """The encoder of an observation space (UnsupportedSpace when there is none);
    `images` as describe_space takes them. The encoder keeps its `description`, which
    policy specs save."""
    description = describe_space(space, images=images)
    encoder = encoder_from_description(description)
    encoder.description = description
    return encoder


def description_of_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The observation description in a policy spec (model.pt); model files written
    before encoders came hold only the shape of a float vector."""
    return spec.get("observation") or {"type": "box", "shape": spec["obs_shape"]}
