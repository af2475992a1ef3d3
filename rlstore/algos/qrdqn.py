"""QR-DQN, quantile regression DQN (Dabney et al. 2018), as sb3-contrib's QRDQN: each
action's return is n quantiles at the fractions (2i + 1) / 2n, learnt by the quantile
Huber loss against the Bellman targets of the next state's quantiles.

The loop is DQN's (dqn.py: act epsilon-greedily, store, gradient steps, target updates);
this file holds the config, the loss and the registry entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
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
from rlstore.host_updates import allowed_argmax, no_bootstrap
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


def host_quantile_loss(
    out: np.ndarray,
    next_out: np.ndarray,
    next_online: np.ndarray | None,
    batch: Any,
    cfg: QRDQNConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """quantile_loss on the quantile network's outputs in numpy, in the form
    HostDQNStep takes a loss (rlstore/host_updates.py): the outputs (B, actions x
    quantiles) of the online network at s (`out`), of the target network at s' and, with
    Double DQN, of the online one at s'. Returns (per-sample loss, its derivative in `out`,
    the per-sample loss again as the priority, Q(s, a)). The derivative of the quantile
    Huber loss in a predicted quantile p_i is mean_j |tau_i - 1{t_j < p_i}| clip(p_i - t_j,
    -1, 1) (kappa 1)."""
    B, n = len(out), cfg.n_quantiles
    rows = np.arange(B)
    next_quantiles = next_out.reshape(B, -1, n)
    chooser = next_quantiles if next_online is None else next_online.reshape(B, -1, n)
    chosen = allowed_argmax(chooser.mean(-1), batch.next_action_masks)
    discounts = np.where(no_bootstrap(batch), np.float32(0.0), batch.discounts)
    target = batch.rewards[:, None] + discounts[:, None] * next_quantiles[rows, chosen]
    quantiles = out.reshape(B, -1, n)[rows, batch.actions]
    taus = (np.arange(n, dtype=np.float32)[:, None] + np.float32(0.5)) / np.float32(n)
    diff = quantiles[:, :, None] - target[:, None, :]  # (B, n, n): p_i - t_j
    weight = np.where(diff > 0, 1 - taus, taus)
    clipped = np.clip(diff, -1.0, 1.0)  # the Huber term's derivative
    huber = diff - 0.5 * clipped  # times `clipped`: d^2 / 2 within 1, |d| - 1/2 beyond
    huber *= clipped
    # (sums, then / n: numpy's mean costs more than its arithmetic on these sizes)
    per_sample = (weight * huber).sum((1, 2)) / np.float32(n)
    d_out = np.zeros_like(out).reshape(B, -1, n)
    d_out[rows, batch.actions] = (weight * clipped).sum(-1) / np.float32(n)
    return per_sample, d_out.reshape(B, -1), per_sample, quantiles.sum(-1) / np.float32(n)


# From this many quantiles the loss by sorted targets is the faster (batch 32, one thread:
# 0.5 against 0.6 ms at 50, 3.3 against 13.7 ms at Atari's 200; at 25, 0.35 against 0.22)
SORTED_LOSS_FROM = 50


def host_loss(cfg: QRDQNConfig) -> Callable | None:
    """The numpy loss of HostDQNStep's gradient step: the pairwise one below
    SORTED_LOSS_FROM quantiles (above it torch's sorted loss is the faster)."""
    return host_quantile_loss if cfg.n_quantiles < SORTED_LOSS_FROM else None


VARIANT = dqn.QVariant(network=build_network, loss=quantile_loss, host_loss=host_loss)


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
