"""TD3 (Fujimoto et al. 2018), as CleanRL's td3_continuous_action.py: a deterministic actor
with Gaussian exploration noise, twin Q critics, target policy smoothing, and delayed
actor and target updates.

Reads top to bottom: the config, the losses as pure functions, one gradient step, then
train(): build, and the loop (_off_policy.collect_and_train) of act (uniformly random
until learning_starts, then the actor plus noise) -> store -> gradient steps (the critics
at every one; the actor and the soft target updates at every policy_frequency-th) -> log;
last, its registry entry (ALGORITHM).

DDPG (ddpg.py) runs this same code with one critic and no target smoothing, which is all
that tells CleanRL's ddpg_continuous_action.py from its td3_continuous_action.py.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from gymnasium import spaces
from torch.nn import functional as F

from rlstore.algos import Algorithm
from rlstore.algos._off_policy import (
    DeterministicOffPolicyConfig,
    check_bounded_actions,
    collect_and_train,
    frozen,
    make_replay_buffer,
)
from rlstore.algos._shared import update_target
from rlstore.callbacks import Callback
from rlstore.config import NonNegative
from rlstore.continuous_networks import DeterministicActorCritic
from rlstore.encoders import encoder_for
from rlstore.envs import make_training_envs
from rlstore.machine import optimizer_step
from rlstore.networks import policy_spec
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBatch, ReplayBuffer


@dataclass
class TD3Config(DeterministicOffPolicyConfig):
    """Twin Delayed DDPG (CleanRL's defaults)."""

    policy_noise: NonNegative = 0.2
    """Std of the target policy smoothing noise, in units of the box's half-width."""
    noise_clip: NonNegative = 0.5
    """The smoothing noise is clipped to +-noise_clip (before scaling to the box)."""
    critics: ClassVar[int] = 2  # DDPG has one


def smoothed_target_action(
    target: DeterministicActorCritic, next_obs: torch.Tensor, cfg: DeterministicOffPolicyConfig
) -> torch.Tensor:
    """The target policy's action at s' plus clipped noise, clipped to the box:
    clip(mu'(s') + clip(N(0, policy_noise), -noise_clip, noise_clip) * scale, low, high);
    mu'(s') itself without the noise (DDPG), which draws none."""
    action = target.deterministic_action(next_obs)
    if cfg.policy_noise == 0:
        return action
    noise = (torch.randn_like(action) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
    bounds = target.bounds
    return torch.clamp(action + noise * bounds.scale, bounds.low, bounds.high)


def critic_target(
    target: DeterministicActorCritic, batch: ReplayBatch, cfg: DeterministicOffPolicyConfig
) -> torch.Tensor:
    """r + gamma * (1 - terminated) * min(Q1', Q2')(s', a'), a' the smoothed target action
    and Q' the target critics (DDPG: Q1' alone, at a' = mu'(s')): a termination cuts the
    bootstrap, a truncation does not."""
    with torch.no_grad():
        next_action = smoothed_target_action(target, batch.next_obs, cfg)
        next_q = target.critic(target.encoder(batch.next_obs), next_action)
        lowest = next_q[0] if len(next_q) == 1 else torch.min(*next_q)
        return batch.rewards + batch.discounts * lowest.masked_fill(batch.terminated, 0.0)


def critic_loss(
    agent: DeterministicActorCritic,
    target: DeterministicActorCritic,
    batch: ReplayBatch,
    cfg: DeterministicOffPolicyConfig,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """((Q1 loss, Q2 loss), (Q1(s, a), Q2(s, a))) on a replay batch, or the same of Q1
    alone (DDPG): the mean squared errors against critic_target."""
    q_target = critic_target(target, batch, cfg)
    q = agent.critic(agent.encoder(batch.obs), batch.actions)
    return tuple(F.mse_loss(qi, q_target) for qi in q), tuple(qi.detach() for qi in q)


def actor_loss(agent: DeterministicActorCritic, obs: torch.Tensor) -> torch.Tensor:
    """-Q1(s, mu(s)), averaged: the deterministic policy gradient through the first critic
    (the critics' own parameters get no gradient: the caller freezes them)."""
    features = agent.encoder(obs)
    return -agent.critic.q1(torch.cat((features, agent.deterministic_action(obs)), -1)).mean()


def gradient_step(
    number: int,
    agent: DeterministicActorCritic,
    target: DeterministicActorCritic,
    actor_optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    buffer: ReplayBuffer,
    cfg: DeterministicOffPolicyConfig,
) -> dict[str, torch.Tensor]:
    """Gradient step `number` (1, 2, ...): the critics on a replay batch; at every
    policy_frequency-th, the actor on that batch and the soft update of every target
    network. Returns what it logs, as tensors (read only when logged)."""
    batch = buffer.sample(cfg.batch_size)
    losses, q = critic_loss(agent, target, batch, cfg)
    total = sum(losses)
    critic_optimizer.zero_grad(set_to_none=True)
    total.backward()
    optimizer_step(critic_optimizer)
    logged = {"losses/qf_loss": total.detach() / len(losses)}
    for i, (loss, qi) in enumerate(zip(losses, q, strict=True), start=1):
        logged |= {f"losses/qf{i}_loss": loss.detach(), f"losses/qf{i}_values": qi.mean()}
    if number % cfg.policy_frequency == 0:
        with frozen(agent.critic):
            loss = actor_loss(agent, batch.obs)
        actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer_step(actor_optimizer)
        update_target(target, agent, cfg.tau)
        logged["losses/actor_loss"] = loss.detach()
    return logged


def train(
    cfg: DeterministicOffPolicyConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
    algorithm: Algorithm | None = None,
) -> TrainResult:
    """Train TD3 as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run after every vector step (rlstore.run.Callback). `algorithm`:
    the one whose run this is (TD3's, or DDPG's with a DDPGConfig).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    algorithm = algorithm or ALGORITHM
    run = Run(cfg, algorithm.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, algorithm)
    check_bounded_actions(envs, cfg.env_id, algorithm.name)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    agent = DeterministicActorCritic(
        0,
        action_space.low,
        action_space.high,
        cfg.hidden,
        cfg.exploration_noise,
        cfg.critics,
        encoder_for(obs_space),
    ).to(device)
    target = copy.deepcopy(agent)  # the target actor and the target critics
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=cfg.learning_rate, fused=True)
    critic_optimizer = torch.optim.Adam(agent.critic.parameters(), lr=cfg.learning_rate, fused=True)
    buffer = make_replay_buffer(cfg, envs, device)
    obs, _ = envs.reset(seed=cfg.seed)
    spec = policy_spec(agent, obs_space, action_space)
    state = TrainingState(
        envs,
        agent,
        spec,
        obs,
        target=target,
        buffer=buffer,
        actor_optimizer=actor_optimizer,
        critic_optimizer=critic_optimizer,
    )
    return collect_and_train(
        run,
        state,
        cfg,
        lambda number: gradient_step(
            number, agent, target, actor_optimizer, critic_optimizer, buffer, cfg
        ),
    )


ALGORITHM = Algorithm(
    name="td3",
    summary="Twin Delayed DDPG: twin Q, target smoothing, delayed actor (continuous actions)",
    config=TD3Config,
    train=train,
    action_spaces=(spaces.Box,),
    defaults="CleanRL's td3_continuous_action.py",
    networks=(DeterministicActorCritic,),
    image_observations=False,
)
