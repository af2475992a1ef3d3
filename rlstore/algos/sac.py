"""SAC (Haarnoja et al. 2018), as CleanRL's sac_continuous_action.py: a squashed Gaussian
actor, twin Q critics with target copies, and an entropy coefficient tuned toward a target
entropy.

Reads top to bottom: the config, the losses as pure functions, the entropy coefficient,
one gradient step, then train(): build, and the loop (_off_policy.collect_and_train) of
act (uniformly random until learning_starts, then sampled from the actor) -> store ->
gradient steps (the critics at every one, the actor and the entropy coefficient at every
policy_frequency-th, as many times as that frequency) -> log; last, its registry entry
(ALGORITHM).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from rlstore.algos import Algorithm
from rlstore.algos._off_policy import (
    ContinuousOffPolicyConfig,
    check_bounded_actions,
    collect_and_train,
    frozen,
    make_replay_buffer,
)
from rlstore.algos._shared import update_target
from rlstore.callbacks import Callback
from rlstore.config import NonNegative, NonNegativeInt, Positive
from rlstore.continuous_networks import SquashedGaussianActorCritic
from rlstore.encoders import encoder_for
from rlstore.envs import make_training_envs
from rlstore.machine import optimizer_step
from rlstore.networks import policy_spec
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBatch, ReplayBuffer


@dataclass
class SACConfig(ContinuousOffPolicyConfig):
    """Soft Actor-Critic with automatic entropy tuning (CleanRL's defaults)."""

    learning_starts: NonNegativeInt = 5_000
    policy_lr: Positive = 3e-4
    """Adam learning rate of the actor."""
    q_lr: Positive = 1e-3
    """Adam learning rate of the critics (and of the entropy coefficient)."""
    autotune: bool = True
    """Tune the entropy coefficient alpha so that the policy's entropy approaches
    target_entropy; without it alpha stays at --alpha."""
    alpha: NonNegative = 0.2
    """The entropy coefficient when it is not tuned."""


def critic_target(
    agent: SquashedGaussianActorCritic,
    target_critic: nn.Module,
    batch: ReplayBatch,
    alpha: torch.Tensor,
) -> torch.Tensor:
    """r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')), with
    a' ~ pi(s') and Q' the target critics: a termination cuts the bootstrap, a truncation
    does not (its s' is the true final observation, which the buffer keeps)."""
    with torch.no_grad():
        next_action, next_log_prob = agent.act(batch.next_obs)
        next_q1, next_q2 = target_critic(agent.encoder(batch.next_obs), next_action)
        soft_value = torch.min(next_q1, next_q2) - alpha * next_log_prob
        return batch.rewards + batch.discounts * soft_value.masked_fill(batch.terminated, 0.0)


def critic_loss(
    agent: SquashedGaussianActorCritic,
    target_critic: nn.Module,
    batch: ReplayBatch,
    alpha: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Q1 loss, Q2 loss, Q1(s, a), Q2(s, a)) on a replay batch: the mean squared errors
    against critic_target."""
    target = critic_target(agent, target_critic, batch, alpha)
    q1, q2 = agent.critic(agent.encoder(batch.obs), batch.actions)
    return F.mse_loss(q1, target), F.mse_loss(q2, target), q1.detach(), q2.detach()


def actor_loss(
    agent: SquashedGaussianActorCritic, obs: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    """E[alpha * log pi(a|s) - min(Q1, Q2)(s, a)], a ~ pi(s) reparameterized (the critics'
    own parameters get no gradient: the caller freezes them)."""
    action, log_prob = agent.act(obs)
    q1, q2 = agent.critic(agent.encoder(obs), action)
    return (alpha * log_prob - torch.min(q1, q2)).mean()


def alpha_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """-alpha * (log pi + target_entropy), averaged (CleanRL's form): its gradient raises
    alpha while the policy's entropy, -E[log pi], is below the target, lowers it while
    above, and vanishes where they are equal."""
    return (-log_alpha.exp() * (log_prob + target_entropy)).mean()


class EntropyCoefficient(nn.Module):
    """alpha = exp(log_alpha), tuned by its own optimizer (log_alpha starts at 0, alpha at 1,
    as CleanRL's) or fixed."""

    def __init__(self, fixed: float | None = None) -> None:
        super().__init__()
        start = 0.0 if fixed is None else math.log(fixed) if fixed > 0 else -math.inf
        self.log_alpha = nn.Parameter(torch.tensor(start), requires_grad=fixed is None)

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()


@dataclass
class Optimizers:
    actor: torch.optim.Optimizer
    critic: torch.optim.Optimizer
    alpha: torch.optim.Optimizer | None


def gradient_step(
    number: int,
    agent: SquashedGaussianActorCritic,
    target_critic: nn.Module,
    entropy: EntropyCoefficient,
    optimizers: Optimizers,
    buffer: ReplayBuffer,
    cfg: SACConfig,
    target_entropy: float,
) -> dict[str, torch.Tensor]:
    """Gradient step `number` (1, 2, ...): the critics on a replay batch; at every
    policy_frequency-th, policy_frequency steps of the actor and the entropy coefficient on
    that batch (CleanRL's delayed, compensated actor updates); then the soft target update.
    Returns what it logs, as tensors (read only when logged)."""
    batch = buffer.sample(cfg.batch_size)
    q1_loss, q2_loss, q1, q2 = critic_loss(agent, target_critic, batch, entropy.alpha)
    optimizers.critic.zero_grad(set_to_none=True)
    (q1_loss + q2_loss).backward()
    optimizer_step(optimizers.critic)
    logged = {
        "losses/qf1_loss": q1_loss.detach(),
        "losses/qf2_loss": q2_loss.detach(),
        "losses/qf_loss": (q1_loss + q2_loss).detach() / 2.0,
        "losses/qf1_values": q1.mean(),
        "losses/qf2_values": q2.mean(),
    }
    if number % cfg.policy_frequency == 0:
        for _ in range(cfg.policy_frequency):
            with frozen(agent.critic):
                loss = actor_loss(agent, batch.obs, entropy.alpha)
            optimizers.actor.zero_grad(set_to_none=True)
            loss.backward()
            optimizer_step(optimizers.actor)
            logged["losses/actor_loss"] = loss.detach()
            if optimizers.alpha is not None:
                with torch.no_grad():
                    log_prob = agent.act(batch.obs)[1]
                a_loss = alpha_loss(entropy.log_alpha, log_prob, target_entropy)
                optimizers.alpha.zero_grad(set_to_none=True)
                a_loss.backward()
                optimizer_step(optimizers.alpha)
                logged["losses/alpha_loss"] = a_loss.detach()
    update_target(target_critic, agent.critic, cfg.tau)
    return logged


def train(
    cfg: SACConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train SAC as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run after every vector step (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, ALGORITHM)
    check_bounded_actions(envs, cfg.env_id, ALGORITHM.name)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    agent = SquashedGaussianActorCritic(
        0, action_space.low, action_space.high, cfg.hidden, encoder_for(obs_space)
    ).to(device)
    target_critic = copy.deepcopy(agent.critic)
    entropy = EntropyCoefficient(None if cfg.autotune else cfg.alpha).to(device)
    target_entropy = -float(np.prod(action_space.shape))  # -dim(A), SAC's heuristic
    optimizers = Optimizers(
        actor=torch.optim.Adam(agent.actor.parameters(), lr=cfg.policy_lr, fused=True),
        critic=torch.optim.Adam(agent.critic.parameters(), lr=cfg.q_lr, fused=True),
        alpha=torch.optim.Adam([entropy.log_alpha], lr=cfg.q_lr) if cfg.autotune else None,
    )
    buffer = make_replay_buffer(cfg, envs, device)
    obs, _ = envs.reset(seed=cfg.seed)
    spec = policy_spec(agent, obs_space, action_space)
    parts = {"actor_optimizer": optimizers.actor, "critic_optimizer": optimizers.critic}
    if optimizers.alpha is not None:
        parts["alpha_optimizer"] = optimizers.alpha
    state = TrainingState(
        envs, agent, spec, obs, target_critic=target_critic, entropy=entropy, buffer=buffer, **parts
    )
    return collect_and_train(
        run,
        state,
        cfg,
        lambda number: gradient_step(
            number, agent, target_critic, entropy, optimizers, buffer, cfg, target_entropy
        ),
        lambda: {"losses/alpha": entropy.alpha},
    )


ALGORITHM = Algorithm(
    name="sac",
    summary="Soft Actor-Critic, twin Q and automatic entropy tuning (continuous actions)",
    config=SACConfig,
    train=train,
    action_spaces=(spaces.Box,),
    defaults="CleanRL's sac_continuous_action.py",
    networks=(SquashedGaussianActorCritic,),
    image_observations=False,
)
