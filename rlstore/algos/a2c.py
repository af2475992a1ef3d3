"""A2C (Mnih et al. 2016, synchronous): one gradient step per short rollout.

Reads top to bottom: the config, the loss as a pure function, the update, then train():
build, and the loop of collect -> compute returns -> one update -> log; last, its registry
entry (ALGORITHM).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from gymnasium import spaces
from torch import nn

from rlstore.algos import Algorithm
from rlstore.algos._on_policy import (
    build_actor_critic,
    collect_rollout,
    compute_returns,
    explained_variance,
)
from rlstore.algos._shared import linear_schedule, optimizer_params
from rlstore.callbacks import Callback
from rlstore.config import Count, Fraction, OnPolicyConfig, Positive
from rlstore.host_updates import HostA2CStep
from rlstore.machine import optimizer_step
from rlstore.networks import ActorCritic, CnnActorCritic
from rlstore.run import Run, TrainResult
from rlstore.storage import RolloutBatch


@dataclass
class A2CConfig(OnPolicyConfig):
    """Advantage Actor-Critic (synchronous, one update per rollout)."""

    # The published A2C settings differ from PPO's here (OpenAI baselines, SB3):
    learning_rate: Positive = 7e-4
    anneal_lr: bool = False
    num_steps: Count = 5
    gae_lambda: Fraction = 1.0
    norm_adv: bool = False
    rmsprop_alpha: Fraction = 0.99
    """RMSprop smoothing constant."""
    rmsprop_eps: Positive = 1e-5
    """RMSprop epsilon."""


def a2c_loss(
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    value: torch.Tensor,
    returns: torch.Tensor,
    entropy: torch.Tensor,
    cfg: A2CConfig,
) -> dict[str, torch.Tensor]:
    """Policy gradient -A * log pi, value MSE (as in OpenAI baselines and SB3), entropy bonus."""
    if cfg.norm_adv and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -(advantages * log_prob).mean()
    value_loss = (returns - value).square().mean()
    entropy_mean = entropy.mean()
    loss = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
    return {
        "loss": loss,
        "losses/policy_loss": policy_loss.detach(),
        "losses/value_loss": value_loss.detach(),
        "losses/entropy": entropy_mean.detach(),
    }


def a2c_update(
    agent: ActorCritic,
    optimizer: torch.optim.Optimizer,
    data: dict[str, torch.Tensor],
    cfg: A2CConfig,
    fast_step: HostA2CStep | None = None,
) -> dict[str, torch.Tensor]:
    """One gradient step on the whole rollout (`data`: storage.flatten() after its returns);
    its losses. `fast_step`, if given, takes the same step in numpy (rlstore/host_updates.py)."""
    if fast_step is not None:
        losses = fast_step(RolloutBatch(*(data.get(k) for k in RolloutBatch._fields)), cfg)
    else:
        log_prob, entropy, value = agent.evaluate(
            data["obs"], data["actions"], data.get("action_masks")
        )
        losses = a2c_loss(log_prob, data["advantages"], value, data["returns"], entropy, cfg)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        nn.utils.clip_grad_norm_(optimizer_params(optimizer), cfg.max_grad_norm, foreach=True)
        optimizer_step(optimizer)
    losses.pop("loss")
    return losses


def train(
    cfg: A2CConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train A2C as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run as it goes (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    agent, storage, state = build_actor_critic(cfg, ALGORITHM, run.device)
    optimizer = torch.optim.RMSprop(
        agent.parameters(),
        lr=cfg.learning_rate,
        alpha=cfg.rmsprop_alpha,
        eps=cfg.rmsprop_eps,
        foreach=True,
    )
    state.parts["optimizer"] = optimizer
    fast = cfg.use_fast_paths and HostA2CStep.supports(agent, optimizer)
    fast_step = HostA2CStep(agent, optimizer) if fast else None

    with run.start(state):
        for iteration in run.iterations():
            lr = cfg.learning_rate
            if cfg.anneal_lr:
                lr = linear_schedule(cfg.learning_rate, 0.0, cfg.num_iterations, iteration)
                optimizer.param_groups[0]["lr"] = lr

            # -- collect and compute returns ----------------------------------------------
            collect_rollout(agent, storage, state, run)
            compute_returns(agent, storage, cfg)

            # -- update: one gradient step on the whole rollout ----------------------------
            data = storage.flatten()
            losses = a2c_update(agent, optimizer, data, cfg, fast_step)

            # -- log -----------------------------------------------------------------------
            if run.log_due():
                losses["losses/explained_variance"] = explained_variance(
                    data["values"], data["returns"]
                )
                losses["charts/learning_rate"] = lr
                run.log_scalars(losses)
            storage.after_update()
        return run.finish()


ALGORITHM = Algorithm(
    name="a2c",
    summary="Advantage Actor-Critic (synchronous): one update per short rollout",
    config=A2CConfig,
    train=train,
    action_spaces=(spaces.Discrete, spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary),
    networks=(ActorCritic, CnnActorCritic),
    action_masks=True,
)
