"""CrossQ (Bhatt et al. 2024), as sb3-contrib's CrossQ: SAC without target networks.
Batch renormalization in the actor and the critics, and (s, a) and (s', a') through the
critics in one joint batch, so that both share the same batch statistics; the target is
that pass's (s', a') half, detached. Wide critics, Adam with beta1 = 0.5, and the actor
updated every policy_delay-th step.

Reads top to bottom: the config, batch renormalization, the networks, one gradient step
(sb3-contrib's order: critics; at the actor's steps the entropy coefficient, then the
actor), then train(): build, and the loop (_off_policy.collect_and_train) of act
(uniformly random until learning_starts, then sampled, with the running statistics) ->
store -> gradient steps -> log; last, its registry entry.

Modes: the networks stay in eval mode (running statistics) except for the one forward
pass of each update that is meant to use and update batch statistics: the critics' joint
pass and the actor's pass on the batch's observations, as sb3-contrib sets them.
"""

from __future__ import annotations

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
from rlstore.algos.sac import EntropyCoefficient
from rlstore.callbacks import Callback
from rlstore.config import Count, Fraction, NonNegative, NonNegativeInt, Positive, check_widths
from rlstore.continuous_networks import BoundedActions, squashed_gaussian_log_prob
from rlstore.encoders import description_of_spec, encoder_for, encoder_from_description
from rlstore.envs import make_training_envs
from rlstore.machine import optimizer_step
from rlstore.networks import policy_spec
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBuffer


@dataclass
class CrossQConfig(ContinuousOffPolicyConfig):
    """CrossQ (defaults: sb3-contrib's CrossQ)."""

    learning_rate: Positive = 1e-3
    """Adam learning rate of the actor, the critics and the entropy coefficient."""
    adam_beta1: Fraction = 0.5
    """Adam's beta1 for the actor and the critics (sb3-contrib's 0.5; the entropy
    coefficient's Adam keeps 0.9)."""
    learning_starts: NonNegativeInt = 100
    policy_frequency: Count = 3
    """The actor and the entropy coefficient learn at every policy_frequency-th gradient
    step of the critics (sb3-contrib's policy_delay)."""
    hidden: tuple[int, ...] = (256, 256)
    """Widths of the actor's hidden ReLU layers."""
    critic_hidden: tuple[int, ...] = (1024, 1024)
    """Widths of each critic's hidden ReLU layers."""
    autotune: bool = True
    """Tune the entropy coefficient alpha toward the target entropy -dim(A); without it
    alpha stays at --alpha."""
    alpha: NonNegative = 0.2
    """The entropy coefficient when it is not tuned."""
    renorm_momentum: Fraction = 0.01
    """Batch renormalization: the rate of its running mean and variance."""
    renorm_warmup_steps: NonNegativeInt = 100_000
    """Batch renormalization: training passes that normalize by the batch's statistics
    alone, before the running statistics correct them."""

    def check(self) -> None:
        super().check()
        check_widths("--critic-hidden", self.critic_hidden)


class BatchRenorm(nn.Module):
    """Batch renormalization (Ioffe 2017), as sb3-contrib's BatchRenorm: in training mode
    it normalizes by the batch's mean and variance, corrected toward the running ones by
    r = clip(std_batch / std_run, 1/3, 3) and d = clip((mean_batch - mean_run) / std_run,
    -5, 5) once `warmup_steps` training passes are done, and updates the running
    statistics; in eval mode it normalizes by the running statistics alone. Then a learnt
    scale and bias.

    The normalization and the affine are one x * a + b, and the batch variance is the mean
    square of the centred batch: torch's `var(0)` and the four-op formula cost 3-4 times as
    much on a 512 x 1024 batch (fwd + bwd, one thread), the most of a CrossQ step after its
    matmuls.

    The count of training passes is a buffer (checkpoints keep it) with a host copy that
    decides the warm-up, so that a pass on a GPU does not wait for the device to say it;
    the copy is read from the buffer once after a load."""

    RMAX, DMAX = 3.0, 5.0

    def __init__(
        self, features: int, momentum: float, warmup_steps: int, eps: float = 1e-3
    ) -> None:
        super().__init__()
        self.momentum, self.warmup_steps, self.eps = momentum, warmup_steps, eps
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.register_buffer("steps", torch.tensor(0, dtype=torch.long))
        self.host_steps: int | None = 0  # `steps` on the host; None: read it at the next pass
        self.register_load_state_dict_post_hook(BatchRenorm._forget_host_steps)
        self.scale = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))

    @staticmethod
    def _forget_host_steps(module: BatchRenorm, incompatible_keys: object) -> None:
        module.host_steps = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            a = self.scale * (self.running_var + self.eps).rsqrt()
            return torch.addcmul(self.bias - a * self.running_mean, x, a)
        batch_mean = x.mean(0)
        centred = x - batch_mean
        batch_var = centred.square().sum(0) / (len(x) - 1)  # unbiased, as x.var(0)
        mean, var = batch_mean, batch_var
        if self.host_steps is None:
            self.host_steps = int(self.steps)
        if self.host_steps > self.warmup_steps:
            running_std = (self.running_var + self.eps).sqrt()
            batch_std = (batch_var + self.eps).sqrt()
            r = (batch_std / running_std).detach().clamp(1 / self.RMAX, self.RMAX)
            d = ((batch_mean - self.running_mean) / running_std).detach()
            d = d.clamp(-self.DMAX, self.DMAX)
            mean, var = batch_mean - d * batch_var.sqrt() / r, batch_var / r.square()
        with torch.no_grad():
            self.running_mean.lerp_(batch_mean, self.momentum)
            self.running_var.lerp_(batch_var, self.momentum)
            self.steps += 1
        self.host_steps += 1
        # scale * (x - mean) / sqrt(var + eps) + bias, where x - mean = centred + batch_mean - mean
        a = self.scale * (var + self.eps).rsqrt()
        return torch.addcmul(self.bias + a * (batch_mean - mean), centred, a)


def renorm_mlp(
    in_dim: int, hidden: tuple[int, ...], out_dim: int, renorm: dict, last_renorm: bool = True
) -> nn.Sequential:
    """sb3-contrib's CrossQ MLP: before every linear layer a BatchRenorm of its input,
    ReLU after the hidden ones; `out_dim` 0 ends with the last hidden layer's features
    (renormalized with `last_renorm`, as the actor's latent)."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [BatchRenorm(in_dim, **renorm), nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    if out_dim:
        return nn.Sequential(*layers, BatchRenorm(in_dim, **renorm), nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers, *([BatchRenorm(in_dim, **renorm)] if last_renorm else []))


class CrossQActorCritic(nn.Module):
    """CrossQ's networks: a squashed Gaussian actor (log-std clamped to [-20, 2], as
    sb3-contrib's) and `critics` Q critics, all with BatchRenorm layers, on a parameter-free
    encoder; Q on env-scale actions, as SAC's here."""

    SPEC_NAME = "crossq_actor_critic"
    continuous = True
    LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0

    def __init__(
        self,
        low: Sequence[float],
        high: Sequence[float],
        hidden: tuple[int, ...],
        critic_hidden: tuple[int, ...],
        encoder: nn.Module,
        momentum: float = 0.01,
        warmup_steps: int = 100_000,
        critics: int = 2,
    ) -> None:
        super().__init__()
        action_dim = len(low)
        self.hidden, self.critic_hidden, self.critics = tuple(hidden), tuple(critic_hidden), critics
        self.momentum, self.warmup_steps = momentum, warmup_steps
        renorm = {"momentum": momentum, "warmup_steps": warmup_steps}
        self.encoder = encoder
        obs_dim = encoder.out_dim
        # the latent features, then the Gaussian's mean and log-std side by side
        self.actor = nn.Sequential(
            *renorm_mlp(obs_dim, self.hidden, 0, renorm),
            nn.Linear(self.hidden[-1], 2 * action_dim),
        )
        self.bounds = BoundedActions(low, high)
        self.critic = nn.ModuleList(
            renorm_mlp(obs_dim + action_dim, self.critic_hidden, 1, renorm) for _ in range(critics)
        )
        self.eval()  # running statistics, but in the passes an update sets

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.actor(self.encoder(obs)).chunk(2, -1)
        return mean, log_std.clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action in the env's box, its log-prob), reparameterized."""
        mean, log_std = self.distribution(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        action = self.bounds(torch.tanh(u))
        return action, squashed_gaussian_log_prob(u, mean, log_std, self.bounds.scale)

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.bounds(torch.tanh(self.distribution(obs)[0]))

    def q(self, features: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Every critic's Q at (encoded obs, action): (batch, critics)."""
        x = torch.cat((features, action), -1)
        return torch.cat([critic(x) for critic in self.critic], -1)

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(Q1, Q2) at (obs, action), shape (batch, critics)."""
        return self.q(self.encoder(obs), action.float())

    def spec_args(self) -> dict:
        return {
            "action_dim": len(self.bounds.low),
            "continuous": True,
            "hidden": list(self.hidden),
            "critic_hidden": list(self.critic_hidden),
            "critics": self.critics,
            "momentum": self.momentum,
            "warmup_steps": self.warmup_steps,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> CrossQActorCritic:
        encoder = encoder_from_description(description_of_spec(spec))
        sizes = tuple(spec["hidden"]), tuple(spec["critic_hidden"])
        renorm = (spec["momentum"], spec["warmup_steps"], spec["critics"])
        return cls(spec["action_low"], spec["action_high"], *sizes, encoder, *renorm)


def gradient_step(
    number: int,
    agent: CrossQActorCritic,
    entropy: EntropyCoefficient,
    optimizers: dict[str, torch.optim.Optimizer],
    buffer: ReplayBuffer,
    cfg: CrossQConfig,
    target_entropy: float,
) -> dict[str, torch.Tensor]:
    """Gradient step `number` (1, 2, ...) on a replay batch: the critics on the joint
    pass; at every policy_frequency-th, the entropy coefficient and the actor. Returns
    what it logs, as tensors."""
    batch = buffer.sample(cfg.batch_size)
    alpha = entropy.alpha  # this step's, before its own update
    with torch.no_grad():
        next_action, next_log_prob = agent.act(batch.next_obs)  # running statistics
    features = agent.encoder(batch.obs), agent.encoder(batch.next_obs)
    agent.critic.train()  # the joint pass: one set of batch statistics for both halves
    q_both = agent.q(torch.cat(features), torch.cat((batch.actions, next_action)))
    agent.critic.eval()
    q, next_q = q_both.split(len(batch.rewards))
    with torch.no_grad():
        soft_value = next_q.min(-1).values - alpha * next_log_prob
        discounts = batch.discounts.masked_fill(batch.terminated, 0.0)
        target = batch.rewards + discounts * soft_value
    q_loss = 0.5 * sum(F.mse_loss(q[:, i], target) for i in range(q.shape[1]))
    optimizers["critic"].zero_grad(set_to_none=True)
    q_loss.backward()
    optimizer_step(optimizers["critic"])
    logged = {"losses/qf_loss": q_loss.detach(), "losses/qf_values": q.detach().mean()}
    if number % cfg.policy_frequency == 0:
        agent.actor.train()  # its pass on the batch's observations updates its statistics
        action_pi, log_prob = agent.act(batch.obs)
        agent.actor.eval()
        if "alpha" in optimizers:
            a_loss = -(entropy.log_alpha * (log_prob.detach() + target_entropy)).mean()
            optimizers["alpha"].zero_grad(set_to_none=True)
            a_loss.backward()
            optimizer_step(optimizers["alpha"])
            logged["losses/alpha_loss"] = a_loss.detach()
        with frozen(agent.critic):
            q_pi = agent.q(agent.encoder(batch.obs), action_pi).min(-1).values
            loss = (alpha * log_prob - q_pi).mean()
        optimizers["actor"].zero_grad(set_to_none=True)
        loss.backward()
        optimizer_step(optimizers["actor"])
        logged["losses/actor_loss"] = loss.detach()
    return logged


def train(
    cfg: CrossQConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train CrossQ as configured, or continue the run in `resume` from its newest
    checkpoint; `callbacks` see the run after every vector step (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, ALGORITHM)
    check_bounded_actions(envs, cfg.env_id, ALGORITHM.name)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    agent = CrossQActorCritic(
        action_space.low,
        action_space.high,
        cfg.hidden,
        cfg.critic_hidden,
        encoder_for(obs_space),
        cfg.renorm_momentum,
        cfg.renorm_warmup_steps,
    ).to(device)
    entropy = EntropyCoefficient(None if cfg.autotune else cfg.alpha).to(device)
    target_entropy = -float(np.prod(action_space.shape))  # -dim(A), SAC's heuristic
    lr, betas = cfg.learning_rate, (cfg.adam_beta1, 0.999)
    optimizers = {
        "actor": torch.optim.Adam(agent.actor.parameters(), lr=lr, betas=betas, fused=True),
        "critic": torch.optim.Adam(agent.critic.parameters(), lr=lr, betas=betas, fused=True),
    }
    if cfg.autotune:
        optimizers["alpha"] = torch.optim.Adam([entropy.log_alpha], lr=lr)
    buffer = make_replay_buffer(cfg, envs, device)
    obs, _ = envs.reset(seed=cfg.seed)
    spec = policy_spec(agent, obs_space, action_space)
    parts = {f"{name}_optimizer": optimizer for name, optimizer in optimizers.items()}
    state = TrainingState(envs, agent, spec, obs, entropy=entropy, buffer=buffer, **parts)
    return collect_and_train(
        run,
        state,
        cfg,
        lambda number: gradient_step(
            number, agent, entropy, optimizers, buffer, cfg, target_entropy
        ),
        lambda: {"losses/alpha": entropy.alpha},
    )


ALGORITHM = Algorithm(
    name="crossq",
    summary="CrossQ: SAC with batch renormalization and no target networks (continuous actions)",
    config=CrossQConfig,
    train=train,
    action_spaces=(spaces.Box,),
    defaults="sb3-contrib's CrossQ",
    networks=(CrossQActorCritic,),
    image_observations=False,
)
