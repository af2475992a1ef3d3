"""C51, categorical DQN (Bellemare et al. 2017), as CleanRL's c51.py: each action's return
is a distribution on n atoms evenly spaced on [v_min, v_max], learnt by cross-entropy
against the projected Bellman target. Double DQN, a dueling head, n-step returns,
prioritized replay and noisy layers are options (rainbow.py turns them all on).

The loop is DQN's (dqn.py: act epsilon-greedily, store, gradient steps, target updates);
this file holds the config, the loss and the registry entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import torch
from torch import nn

from rlstore.action_heads import masked_q
from rlstore.algos import Algorithm, dqn
from rlstore.algos._distributional import (
    DistributionalConfig,
    DistributionalQNetwork,
    categorical_projection,
)
from rlstore.algos._shared import image_options
from rlstore.callbacks import Callback
from rlstore.config import Count
from rlstore.encoders import encoder_for
from rlstore.errors import UsageError
from rlstore.run import TrainResult
from rlstore.storage.replay import ReplayBatch


@dataclass
class C51Config(DistributionalConfig):
    """C51 (defaults: CleanRL's c51.py, whose other settings are its dqn.py's)."""

    n_atoms: Count = 101
    """Atoms of each action's return distribution."""
    v_min: float = -100.0
    """The lowest atom: returns below it count as it."""
    v_max: float = 100.0
    """The highest atom: returns above it count as it."""
    noisy: bool = False
    """Noisy layers in the Q-network's head (Fortunato et al. 2018), which explore in place
    of (or beside) epsilon; evaluation uses their means."""

    def check(self) -> None:
        super().check()
        if self.n_atoms < 2:
            raise UsageError(f"--n-atoms {self.n_atoms} must be at least 2")
        if not self.v_min < self.v_max:
            raise UsageError(f"--v-min {self.v_min} must be below --v-max {self.v_max}")


def build_network(cfg: C51Config, obs_space: gym.Space, num_actions: int) -> nn.Module:
    """The categorical Q-network: cfg.n_atoms atom logits per action."""
    encoder = encoder_for(obs_space, image_options(cfg))
    return DistributionalQNetwork(
        num_actions,
        "categorical",
        cfg.n_atoms,
        cfg.q_hidden,
        encoder,
        dueling=cfg.dueling,
        noisy=cfg.noisy,
        v_min=cfg.v_min,
        v_max=cfg.v_max,
    )


def bootstrap_discounts(batch: ReplayBatch) -> torch.Tensor:
    """Each transition's discount on the next state's value: gamma^k, 0 where the episode
    terminated or (under action masks) the next state allows no action."""
    discounts = batch.discounts.masked_fill(batch.terminated, 0.0)
    if batch.next_action_masks is not None:
        discounts = discounts.masked_fill(~batch.next_action_masks.any(-1), 0.0)
    return discounts


def next_actions(
    q_network: nn.Module, next_q: torch.Tensor, batch: ReplayBatch, double: bool
) -> torch.Tensor:
    """The action each next state bootstraps from: the argmax of the target network's
    Q-values `next_q`, or with Double DQN of the online network's, among the allowed ones."""
    chooser = q_network.q_values(batch.next_obs) if double else next_q
    return masked_q(chooser, batch.next_action_masks).argmax(-1)


def categorical_loss(
    q_network: nn.Module, target_network: nn.Module, batch: ReplayBatch, cfg: C51Config
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted loss, per-sample cross-entropy, Q(s, a)) for a replay batch.

    The target is the next state's distribution at a' (the target network's argmax, or
    the online network's with Double DQN) shifted by the batch's n-step rewards and
    discounts and projected onto the atoms; the loss is its cross-entropy with the
    predicted distribution of (s, a). With PER the cross-entropy is the priority, as in
    Rainbow."""
    rows = torch.arange(len(batch.rewards), device=batch.rewards.device)
    with torch.no_grad():
        next_logits = target_network(batch.next_obs)
        chosen = next_actions(q_network, target_network.q_of(next_logits), batch, cfg.double_dqn)
        next_probs = next_logits[rows, chosen].softmax(-1)
        support = target_network.support
        target = categorical_projection(
            next_probs, batch.rewards, bootstrap_discounts(batch), support
        )
    log_probs = q_network(batch.obs)[rows, batch.actions.long()].log_softmax(-1)
    cross_entropy = -(target * log_probs).sum(-1)
    loss = (batch.weights * cross_entropy).mean() if cfg.prioritized else cross_entropy.mean()
    q_value = (log_probs.detach().exp() * support).sum(-1)
    return loss, cross_entropy.detach(), q_value


VARIANT = dqn.QVariant(network=build_network, loss=categorical_loss)


def train(
    cfg: C51Config,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
    algorithm: Algorithm | None = None,
) -> TrainResult:
    """dqn.train (its arguments and result) with C51's network and loss; `algorithm`:
    the one whose run this is (C51's, or Rainbow's with a RainbowConfig)."""
    return dqn.train(cfg, preset, resume, callbacks, algorithm or ALGORITHM, VARIANT)


ALGORITHM = Algorithm(
    name="c51",
    summary="Categorical DQN: a distribution of returns on fixed atoms per action",
    config=C51Config,
    train=train,
    action_spaces=(gym.spaces.Discrete,),
    defaults="CleanRL's c51.py",
    networks=(DistributionalQNetwork,),
    action_masks=True,
)
