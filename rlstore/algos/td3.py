"""TD3 (Fujimoto et al. 2018), as CleanRL's td3_continuous_action.py: a deterministic actor
with Gaussian exploration noise, twin Q critics, target policy smoothing, and delayed
actor and target updates.

Reads top to bottom: the config, the losses as pure functions, one gradient step, then
train(): build, and the loop of act (uniformly random until learning_starts, then the
actor plus noise) -> store -> gradient steps (the critics at every one; the actor and the
soft target updates at every policy_frequency-th) -> log; last, its registry entry
(ALGORITHM).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from torch.nn import functional as F

from rlstore.algos import Algorithm
from rlstore.algos._off_policy import (
    ContinuousOffPolicyConfig,
    anneal_learning_rates,
    check_bounded_actions,
    explore,
    frozen,
    gradient_steps,
    make_replay_buffer,
    step_and_store,
)
from rlstore.algos._shared import update_target
from rlstore.config import NonNegative, Positive
from rlstore.envs import make_training_envs
from rlstore.networks import DeterministicActorCritic, policy_spec
from rlstore.run import Callback, Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBatch, ReplayBuffer


@dataclass
class TD3Config(ContinuousOffPolicyConfig):
    """Twin Delayed DDPG (CleanRL's defaults)."""

    learning_rate: Positive = 3e-4
    """Adam learning rate of the actor and of the critics."""
    exploration_noise: NonNegative = 0.1
    """Std of the Gaussian noise added to the actor's actions while training, in units of
    the action box's half-width."""
    policy_noise: NonNegative = 0.2
    """Std of the target policy smoothing noise, in units of the box's half-width."""
    noise_clip: NonNegative = 0.5
    """The smoothing noise is clipped to +-noise_clip (before scaling to the box)."""


def smoothed_target_action(
    target: DeterministicActorCritic, next_obs: torch.Tensor, cfg: TD3Config
) -> torch.Tensor:
    """The target policy's action at s' plus clipped noise, clipped to the box:
    clip(mu'(s') + clip(N(0, policy_noise), -noise_clip, noise_clip) * scale, low, high)."""
    action = target.deterministic_action(next_obs)
    noise = (torch.randn_like(action) * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
    bounds = target.bounds
    return torch.clamp(action + noise * bounds.scale, bounds.low, bounds.high)


def critic_target(
    target: DeterministicActorCritic, batch: ReplayBatch, cfg: TD3Config
) -> torch.Tensor:
    """r + gamma * (1 - terminated) * min(Q1', Q2')(s', a'), a' the smoothed target action
    and Q' the target critics: a termination cuts the bootstrap, a truncation does not."""
    with torch.no_grad():
        next_action = smoothed_target_action(target, batch.next_obs, cfg)
        next_q1, next_q2 = target.critic(batch.next_obs.float(), next_action)
        next_value = torch.min(next_q1, next_q2).masked_fill(batch.terminated, 0.0)
        return batch.rewards + batch.discounts * next_value


def critic_loss(
    agent: DeterministicActorCritic,
    target: DeterministicActorCritic,
    batch: ReplayBatch,
    cfg: TD3Config,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Q1 loss, Q2 loss, Q1(s, a), Q2(s, a)) on a replay batch: the mean squared errors
    against critic_target."""
    q_target = critic_target(target, batch, cfg)
    q1, q2 = agent.critic(batch.obs.float(), batch.actions)
    return F.mse_loss(q1, q_target), F.mse_loss(q2, q_target), q1.detach(), q2.detach()


def actor_loss(agent: DeterministicActorCritic, obs: torch.Tensor) -> torch.Tensor:
    """-Q1(s, mu(s)), averaged: the deterministic policy gradient through the first critic
    (the critics' own parameters get no gradient: the caller freezes them)."""
    return -agent.critic.q1(torch.cat((obs.float(), agent.deterministic_action(obs)), -1)).mean()


def gradient_step(
    number: int,
    agent: DeterministicActorCritic,
    target: DeterministicActorCritic,
    actor_optimizer: torch.optim.Optimizer,
    critic_optimizer: torch.optim.Optimizer,
    buffer: ReplayBuffer,
    cfg: TD3Config,
) -> dict[str, torch.Tensor]:
    """Gradient step `number` (1, 2, ...): the critics on a replay batch; at every
    policy_frequency-th, the actor on that batch and the soft update of every target
    network. Returns what it logs, as tensors (read only when logged)."""
    batch = buffer.sample(cfg.batch_size)
    q1_loss, q2_loss, q1, q2 = critic_loss(agent, target, batch, cfg)
    critic_optimizer.zero_grad(set_to_none=True)
    (q1_loss + q2_loss).backward()
    critic_optimizer.step()
    logged = {"losses/qf1_loss": q1_loss.detach(), "losses/qf2_loss": q2_loss.detach(),
              "losses/qf_loss": (q1_loss + q2_loss).detach() / 2.0,
              "losses/qf1_values": q1.mean(), "losses/qf2_values": q2.mean()}  # fmt: skip
    if number % cfg.policy_frequency == 0:
        with frozen(agent.critic):
            loss = actor_loss(agent, batch.obs)
        actor_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        actor_optimizer.step()
        update_target(target, agent, cfg.tau)
        logged["losses/actor_loss"] = loss.detach()
    return logged


def train(
    cfg: TD3Config,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train TD3 as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run after every vector step (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, ALGORITHM)
    check_bounded_actions(envs, cfg.env_id, ALGORITHM.name)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    obs_dim = int(np.prod(obs_space.shape))
    agent = DeterministicActorCritic(obs_dim, action_space.low, action_space.high, cfg.hidden,
                                     cfg.exploration_noise).to(device)  # fmt: skip
    target = copy.deepcopy(agent)  # the target actor and the target critics
    actor_optimizer = torch.optim.Adam(agent.actor.parameters(), lr=cfg.learning_rate, fused=True)
    critic_optimizer = torch.optim.Adam(agent.critic.parameters(), lr=cfg.learning_rate,
                                        fused=True)  # fmt: skip
    buffer = make_replay_buffer(cfg, envs, device)
    obs, _ = envs.reset(seed=cfg.seed)
    spec = policy_spec(agent, obs_space, action_space)
    state = TrainingState(envs, agent, spec, obs, target=target, buffer=buffer,
                          actor_optimizer=actor_optimizer,
                          critic_optimizer=critic_optimizer)  # fmt: skip
    annealed, base_rates = [actor_optimizer, critic_optimizer], [cfg.learning_rate] * 2
    logged: dict[str, torch.Tensor] = {}

    with run.start(state):
        for _ in run.iterations():
            # -- act and store: state.obs is where the envs are -------------------------
            action = explore(agent, state.obs, run, cfg, action_space)
            before = run.global_step
            state.obs = step_and_store(envs, buffer, run, state.obs, action)

            # -- train -----------------------------------------------------------------
            if cfg.anneal_lr:
                left = 1.0 - run.global_step / cfg.total_timesteps
                anneal_learning_rates(annealed, base_rates, left)
            for number in gradient_steps(cfg, before, run.global_step):
                if buffer.ready(cfg.batch_size):
                    logged |= gradient_step(number, agent, target, actor_optimizer,
                                            critic_optimizer, buffer, cfg)  # fmt: skip

            # -- log -----------------------------------------------------------------------
            if run.log_due() and logged:
                run.log_scalars(logged)
        return run.finish()


ALGORITHM = Algorithm(
    name="td3",
    summary="Twin Delayed DDPG: twin Q, target smoothing, delayed actor (continuous actions)",
    config=TD3Config,
    train=train,
    action_spaces=(spaces.Box,),
    defaults="CleanRL's td3_continuous_action.py",
    networks=(DeterministicActorCritic,),
)
