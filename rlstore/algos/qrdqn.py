"""QR-DQN, quantile regression DQN (Dabney et al. 2018), as sb3-contrib's QRDQN: each
action's return is n quantiles at the fractions (2i + 1) / 2n, learnt by the quantile
Huber loss against the Bellman targets of the next state's quantiles.

The loop is DQN's (dqn.py: act epsilon-greedily, store, gradient steps, target updates);
this file holds the config, the loss and the registry entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import gymnasium as gym
import torch
import tyro
from torch import nn

from rlstore.algos import Algorithm, dqn
from rlstore.algos._distributional import (
    DistributionalConfig,
    DistributionalQNetwork,
    quantile_huber_loss,
    quantile_midpoints,
    sorted_quantile_huber_loss,
)
from rlstore.algos._shared import image_options
from rlstore.algos.c51 import bootstrap_discounts, next_actions
from rlstore.callbacks import Callback
from rlstore.config import Count, Fraction, NonNegativeInt, Positive
from rlstore.encoders import encoder_for
from rlstore.run import TrainResult
from rlstore.storage.replay import ReplayBatch


@dataclass
class QRDQNConfig(DistributionalConfig):
    """QR-DQN (defaults: sb3-contrib's QRDQN; RL Zoo's tuned values are presets)."""

    learning_rate: Positive = 5e-5
    buffer_size: Count = 1_000_000
    learning_starts: NonNegativeInt = 100
    batch_size: Count = 32
    train_frequency: Count = 4
    target_network_frequency: Count = 10_000
    exploration_fraction: Fraction = 0.005
    end_e: Fraction = 0.01
    q_hidden: Annotated[tuple[int, ...], tyro.conf.arg(aliases=("--hidden",))] = (64, 64)
    """Widths of the Q-network's hidden ReLU layers (alias: --hidden)."""
    n_quantiles: Count = 200
    """Quantiles of each action's return distribution."""


def build_network(cfg: QRDQNConfig, obs_space: gym.Space, num_actions: int) -> nn.Module:
    """The quantile Q-network: cfg.n_quantiles quantiles per action."""
    encoder = encoder_for(obs_space, image_options(cfg))
    return DistributionalQNetwork(
        num_actions, "quantile", cfg.n_quantiles, cfg.q_hidden, encoder, dueling=cfg.dueling
    )


def quantile_loss(
    q_network: nn.Module, target_network: nn.Module, batch: ReplayBatch, cfg: QRDQNConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted loss, per-sample loss, Q(s, a)) for a replay batch: the quantile Huber
    loss of (s, a)'s quantiles against r + discount * (the target network's quantiles at
    a'), a' its argmax of their means (the online network's with Double DQN)."""
    rows = torch.arange(len(batch.rewards), device=batch.rewards.device)
    with torch.no_grad():
        next_quantiles = target_network(batch.next_obs)
        mean = next_quantiles.mean(-1)
        chosen = next_actions(q_network, mean, batch, cfg.double_dqn)
        discounts = bootstrap_discounts(batch)
        target = batch.rewards[:, None] + discounts[:, None] * next_quantiles[rows, chosen]
    quantiles = q_network(batch.obs)[rows, batch.actions.long()]
    taus = quantile_midpoints(cfg.n_quantiles, quantiles.device)
    sort = cfg.use_fast_paths and cfg.n_quantiles >= SORTED_LOSS_FROM
    per_sample = (sorted_quantile_huber_loss if sort else quantile_huber_loss)(
        quantiles, target, taus
    )
    loss = (batch.weights * per_sample).mean() if cfg.prioritized else per_sample.mean()
    return loss, per_sample.detach(), quantiles.detach().mean(-1)


# From this many quantiles the loss by sorted targets is the faster (batch 32, one thread:
# 0.5 against 0.6 ms at 50, 3.3 against 13.7 ms at Atari's 200; at 25, 0.35 against 0.22)
SORTED_LOSS_FROM = 50

VARIANT = dqn.QVariant(network=build_network, loss=quantile_loss)


def train(
    cfg: QRDQNConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """dqn.train (its arguments and result) with QR-DQN's network and loss."""
    return dqn.train(cfg, preset, resume, callbacks, ALGORITHM, VARIANT)


ALGORITHM = Algorithm(
    name="qrdqn",
    summary="Quantile regression DQN: quantiles of the return per action",
    config=QRDQNConfig,
    train=train,
    action_spaces=(gym.spaces.Discrete,),
    defaults="sb3-contrib's QRDQN",
    networks=(DistributionalQNetwork,),
    action_masks=True,
)
