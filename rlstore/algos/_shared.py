"""What several algorithms' loops share: schedules, target updates, the optimizer's
parameters, the image options, and the replay buffer's memory check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from rlstore.config import CommonConfig, NonNegativeInt
from rlstore.custom_envs import EnvMaker, parse_env_kwargs
from rlstore.encoders import ImageOptions
from rlstore.envs import check_env_id, time_limit
from rlstore.goals import hindsight_for
from rlstore.machine import check_memory
from rlstore.storage.hindsight import Hindsight
from rlstore.storage.replay import ReplayBuffer


@dataclass
class ReplayConfig(CommonConfig):
    """What the algorithms with a replay buffer share: hindsight experience replay."""

    her: bool = False
    """Hindsight experience replay (Andrychowicz et al. 2017), for goal-conditioned envs
    (a Dict observation of observation, achieved_goal and desired_goal, and the env's
    compute_reward): replayed transitions also aim at goals their episodes reached."""
    her_goals: NonNegativeInt = 4
    """With --her: relabelled goals per real one; a fraction goals / (goals + 1) of each
    batch is relabelled (SB3's n_sampled_goal)."""
    her_strategy: Literal["future", "final", "episode"] = "future"
    """With --her: where a relabelled goal comes from: a step at or after the transition's
    (future), the episode's last (final) or any step of it (episode)."""


def make_hindsight(cfg: ReplayConfig) -> Hindsight | None:
    """The run's Hindsight with --her (its env made once, kept for compute_reward), or a
    UsageError saying why the env cannot take it; None without --her."""
    if not cfg.her:
        return None
    make = EnvMaker(
        check_env_id(cfg.env_id).id,
        parse_env_kwargs(cfg.env_kwargs),
        cfg.wrapper,
        cfg.drop_obs_keys,
        **time_limit(cfg.max_episode_steps),
    )
    return hindsight_for(make(), cfg.env_id, cfg.her_goals, cfg.her_strategy)


def image_options(cfg: CommonConfig) -> ImageOptions:
    """How the run's image observations are encoded (--cnn-channels, --image-scale)."""
    return ImageOptions(tuple(cfg.cnn_channels), cfg.image_scale)


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """`start` at t = 0, moving linearly to `end` at t = duration, then staying there."""
    if t >= duration:
        return end
    return start + max(t, 0) / duration * (end - start)


def crossings(before: int, after: int, every: int) -> int:
    """How many multiples of `every` lie in (before, after]: schedules count env steps."""
    return after // every - before // every


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters, in the order the module gave them: what gradient clipping
    needs, without walking the module tree (Module.parameters() does, at every call)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


@torch.no_grad()
def update_target(target_network: nn.Module, online_network: nn.Module, tau: float) -> None:
    """A hard copy (tau = 1) or a Polyak step towards the online network:
    target <- tau * online + (1 - tau) * target, parameter by parameter."""
    pairs = zip(target_network.parameters(), online_network.parameters(), strict=True)
    for target, online in pairs:
        if tau == 1.0:
            target.copy_(online)
        else:
            target.lerp_(online, tau)


def check_replay_fits(
    device: torch.device,
    capacity: int,
    num_envs: int,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype | torch.dtype,
    **buffer_args: Any,
) -> None:
    """Refuse a replay buffer (ReplayBuffer's arguments; observations on `device`) larger
    than the memory left, before it is allocated."""
    obs_bytes, host_bytes = ReplayBuffer.memory_bytes(
        capacity, num_envs, obs_shape, obs_dtype, **buffer_args
    )
    needed = {torch.device("cpu"): host_bytes}
    needed[device] = needed.get(device, 0) + obs_bytes
    per = (obs_bytes + host_bytes) / capacity
    check_memory(
        needed,
        f"--buffer-size {capacity:,} ({per:,.0f} bytes per transition)",
        "lower --buffer-size" + (", or --buffer-device cpu" if device.type == "cuda" else ""),
    )
