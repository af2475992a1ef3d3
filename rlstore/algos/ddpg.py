"""DDPG (Lillicrap et al. 2016), as CleanRL's ddpg_continuous_action.py: a deterministic
actor with Gaussian exploration noise, one Q critic, target copies of both, and the actor
and target updates at every policy_frequency-th gradient step.

CleanRL's DDPG is its TD3 less two things: one critic instead of twins (the target takes
Q1' itself, not a minimum) and no target policy smoothing. So DDPG is TD3's code
(td3.py: losses, gradient step, loop) run with those two settings; this file holds only
its config and its registry entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gymnasium import spaces

from rlstore.algos import Algorithm, td3
from rlstore.algos._off_policy import DeterministicOffPolicyConfig
from rlstore.callbacks import Callback
from rlstore.continuous_networks import DeterministicActorCritic
from rlstore.run import TrainResult


@dataclass
class DDPGConfig(DeterministicOffPolicyConfig):
    """Deep Deterministic Policy Gradient (CleanRL's defaults, which are TD3's): the
    base's one critic, no target policy smoothing."""


def train(
    cfg: DDPGConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """td3.train (its arguments and result), with DDPG's name on the run."""
    return td3.train(cfg, preset, resume, callbacks, algorithm=ALGORITHM)


ALGORITHM = Algorithm(
    name="ddpg",
    summary="Deep Deterministic Policy Gradient: one Q critic, no target smoothing "
    "(continuous actions)",
    config=DDPGConfig,
    train=train,
    action_spaces=(spaces.Box,),
    defaults="CleanRL's ddpg_continuous_action.py",
    networks=(DeterministicActorCritic,),
    image_observations=False,
)
