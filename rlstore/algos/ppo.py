"""PPO (Schulman et al. 2017), clipped surrogate objective with GAE.

Reads top to bottom: the config, the loss as a pure function, the update, then train():
build, and the loop of collect -> compute returns -> minibatch updates -> log; last, its
registry entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from gymnasium import spaces
from torch import nn

from rlstore.algos import Algorithm
from rlstore.algos._on_policy import (
    build_actor_critic,
    collect_rollout,
    compute_returns,
    log_update,
)
from rlstore.algos._shared import linear_schedule, optimizer_params
from rlstore.callbacks import Callback
from rlstore.config import Count, OnPolicyConfig, Positive
from rlstore.errors import UsageError
from rlstore.host_updates import HostPPOStep
from rlstore.machine import optimizer_step
from rlstore.networks import ActorCritic, CnnActorCritic
from rlstore.run import Run, TrainResult
from rlstore.storage import RolloutBatch, RolloutStorage


@dataclass
class PPOConfig(OnPolicyConfig):
    """Proximal Policy Optimization (clipped objective, GAE, minibatch updates)."""

    num_minibatches: Count = 4
    """Minibatches per epoch."""
    update_epochs: Count = 4
    """Epochs over each rollout."""
    clip_coef: Positive = 0.2
    """Surrogate clipping coefficient."""
    anneal_clip: bool = False
    """Decay the clipping coefficient (the policy's and, with clip_vloss, the value's)
    linearly to 0 over the run, as the learning rate with anneal_lr (SB3's clip_range
    schedule; RL Zoo's lin_0.2)."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimates."""
    adam_eps: Positive = 1e-5
    """Adam epsilon."""
    target_kl: Positive | None = None
    """Stop the update epochs early when the approximate KL exceeds this."""

    def check(self) -> None:
        super().check()
        if self.rollout_size % self.num_minibatches:
            raise UsageError(
                f"--num-minibatches {self.num_minibatches} does not divide the rollout "
                f"(num_envs x num_steps = {self.rollout_size}); pick a divisor of "
                f"{self.rollout_size}"
            )


def ppo_loss(
    new_log_prob: torch.Tensor,
    new_value: torch.Tensor,
    entropy: torch.Tensor,
    batch: RolloutBatch,
    cfg: PPOConfig,
    diagnostics: bool = True,
) -> dict[str, torch.Tensor]:
    """The PPO loss and (with `diagnostics`) the KL estimates and clip fraction for one
    minibatch, from the current policy's outputs and the batch's stored log-probs, values,
    advantages and returns.

    policy: mean of max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c));
    value:  0.5 * mean of max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2) when clipped.
    """
    advantages, old_value, returns = batch.advantages, batch.values, batch.returns
    log_ratio = new_log_prob - batch.log_probs
    ratio = log_ratio.exp()
    if cfg.norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    clipped_ratio = ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
    policy_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio).mean()
    value_error = (new_value - returns).square()
    if cfg.clip_vloss:
        clipped_value = old_value + (new_value - old_value).clamp(-cfg.clip_coef, cfg.clip_coef)
        value_error = torch.max(value_error, (clipped_value - returns).square())
    value_loss = 0.5 * value_error.mean()
    entropy_mean = entropy.mean()
    loss = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
    losses = {
        "loss": loss,
        "losses/policy_loss": policy_loss.detach(),
        "losses/value_loss": value_loss.detach(),
        "losses/entropy": entropy_mean.detach(),
    }
    if diagnostics:
        with torch.no_grad():
            losses["losses/old_approx_kl"] = (-log_ratio).mean()
            losses["losses/approx_kl"] = ((ratio - 1) - log_ratio).mean()
            losses["losses/clipfrac"] = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
    return losses


def iteration_config(cfg: PPOConfig, iteration: int) -> PPOConfig:
    """The config an iteration's update uses: `cfg`, with the clipping coefficient of this
    iteration when it is annealed."""
    if not cfg.anneal_clip:
        return cfg
    return replace(
        cfg, clip_coef=linear_schedule(cfg.clip_coef, 0.0, cfg.num_iterations, iteration)
    )


def ppo_update(
    agent: ActorCritic, optimizer: torch.optim.Optimizer, storage: RolloutStorage, cfg: PPOConfig
) -> dict[str, torch.Tensor]:
    """Epochs of minibatch gradient steps on the rollout; returns the last minibatch's losses
    (the KL estimates are computed for the last minibatch of each epoch only: the target-KL
    check and the logs read nothing else)."""
    last = cfg.num_minibatches - 1
    # The same step in numpy, for small MLPs in host memory (rlstore/host_updates.py)
    fast = cfg.use_fast_paths and HostPPOStep.supports(agent, optimizer)
    fast_step = HostPPOStep(agent, optimizer) if fast else None
    for _epoch in range(cfg.update_epochs):
        for i, batch in enumerate(storage.minibatches(cfg.num_minibatches)):
            if fast_step is not None:
                losses = fast_step(batch, cfg, diagnostics=i == last)
                continue
            new_log_prob, entropy, new_value = agent.evaluate(
                batch.obs, batch.actions, batch.action_masks
            )
            losses = ppo_loss(new_log_prob, new_value, entropy, batch, cfg, diagnostics=i == last)
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            nn.utils.clip_grad_norm_(optimizer_params(optimizer), cfg.max_grad_norm, foreach=True)
            optimizer_step(optimizer)
        if cfg.target_kl is not None and losses["losses/approx_kl"] > cfg.target_kl:
            break
    return losses


def train(
    cfg: PPOConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train PPO as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run as it goes (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    agent, storage, state = build_actor_critic(cfg, ALGORITHM, run.device)
    # fused: one kernel for all parameters instead of a Python loop over them
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, fused=True
    )
    state.parts["optimizer"] = optimizer

    with run.start(state):
        for iteration in run.iterations():
            lr = cfg.learning_rate
            if cfg.anneal_lr:
                lr = linear_schedule(cfg.learning_rate, 0.0, cfg.num_iterations, iteration)
                optimizer.param_groups[0]["lr"] = lr

            # -- collect and compute returns ----------------------------------------------
            collect_rollout(agent, storage, state, run)
            compute_returns(agent, storage, cfg)

            # -- update: epochs of minibatches ------------------------------------------
            losses = ppo_update(agent, optimizer, storage, iteration_config(cfg, iteration))

            # -- log -----------------------------------------------------------------------
            log_update(run, storage, losses, lr)
            storage.after_update()
        return run.finish()


ALGORITHM = Algorithm(
    name="ppo",
    summary="Proximal Policy Optimization: clipped objective, GAE, minibatch epochs",
    config=PPOConfig,
    train=train,
    action_spaces=(spaces.Discrete, spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary),
    networks=(ActorCritic, CnnActorCritic),
    action_masks=True,
)
