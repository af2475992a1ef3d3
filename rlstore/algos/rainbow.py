"""Rainbow (Hessel et al. 2018), as CleanRL's rainbow_atari.py: C51 with Double DQN, a
dueling head, 3-step returns, prioritized replay (the cross-entropy as priority) and noisy
layers in place of epsilon-greedy exploration.

Every piece is C51's option (c51.py) over DQN's loop, n-step windows and prioritized
replay (dqn.py, rlstore/storage): this file holds only Rainbow's defaults and its
registry entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym

from rlstore.algos import Algorithm, c51
from rlstore.algos._distributional import DistributionalQNetwork
from rlstore.callbacks import Callback
from rlstore.config import Count, Fraction, NonNegativeInt, Positive
from rlstore.run import TrainResult


@dataclass
class RainbowConfig(c51.C51Config):
    """Rainbow (defaults: CleanRL's rainbow_atari.py; it explores by its noisy layers
    alone, so epsilon is 0 throughout)."""

    total_timesteps: Count = 10_000_000
    learning_rate: Positive = 6.25e-5
    buffer_size: Count = 1_000_000
    target_network_frequency: Count = 8000
    batch_size: Count = 32
    start_e: Fraction = 0.0
    end_e: Fraction = 0.0
    learning_starts: NonNegativeInt = 80_000
    train_frequency: Count = 4
    n_atoms: Count = 51
    v_min: float = -10.0
    v_max: float = 10.0
    adam_eps: Positive | None = 1.5e-4
    double_dqn: bool = True
    dueling: bool = True
    noisy: bool = True
    n_step: Count = 3
    prioritized: bool = True
    per_alpha: Fraction = 0.5


def train(
    cfg: RainbowConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """c51.train (its arguments and result), with Rainbow's name on the run."""
    return c51.train(cfg, preset, resume, callbacks, algorithm=ALGORITHM)


ALGORITHM = Algorithm(
    name="rainbow",
    summary="Rainbow: C51 with Double DQN, dueling, 3-step returns, PER and noisy nets",
    config=RainbowConfig,
    train=train,
    action_spaces=(gym.spaces.Discrete,),
    defaults="CleanRL's rainbow_atari.py",
    networks=(DistributionalQNetwork,),
    action_masks=True,
)
