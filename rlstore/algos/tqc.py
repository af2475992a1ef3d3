"""TQC, truncated quantile critics (Kuznetsov et al. 2020), as sb3-contrib's TQC: SAC's
squashed Gaussian actor and entropy tuning, with critics that each give n quantiles of
the return. The target pools every target critic's quantiles at (s', a'), sorts them and
drops the highest few of each critic's share, which curbs the overestimation that the
minimum of two critics curbs in SAC, by a tunable amount.

Reads top to bottom: the config, the networks, the target and the losses as pure
functions, one gradient step (in sb3-contrib's order: entropy coefficient, critics, actor,
target update), then train(): build, and the loop (_off_policy.collect_and_train) of act
(uniformly random until learning_starts, then sampled) -> store -> gradient steps -> log;
last, its registry entry.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlstore.algos import Algorithm
from rlstore.algos._distributional import (
    quantile_huber_loss,
    quantile_midpoints,
    sorted_quantile_huber_loss,
)
from rlstore.algos._off_policy import (
    ContinuousOffPolicyConfig,
    check_bounded_actions,
    collect_and_train,
    frozen,
    make_replay_buffer,
)
from rlstore.algos._shared import update_target
from rlstore.algos.sac import EntropyCoefficient
from rlstore.callbacks import Callback
from rlstore.config import Count, NonNegative, NonNegativeInt, Positive
from rlstore.continuous_networks import SquashedGaussianActorCritic, relu_mlp
from rlstore.encoders import description_of_spec, encoder_for, encoder_from_description
from rlstore.envs import make_training_envs
from rlstore.errors import UsageError
from rlstore.machine import optimizer_step
from rlstore.networks import policy_spec
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBatch, ReplayBuffer


@dataclass
class TQCConfig(ContinuousOffPolicyConfig):
    """Truncated Quantile Critics (defaults: sb3-contrib's TQC, with the paper's five
    critics; sb3-contrib's default is two, which RL Zoo's presets keep)."""

    learning_rate: Positive = 3e-4
    """Adam learning rate of the actor, the critics and the entropy coefficient."""
    learning_starts: NonNegativeInt = 100
    policy_frequency: Count = 1
    """The actor and the entropy coefficient learn at every policy_frequency-th gradient
    step of the critics (sb3-contrib: every one)."""
    autotune: bool = True
    """Tune the entropy coefficient alpha toward the target entropy -dim(A); without it
    alpha stays at --alpha."""
    alpha: NonNegative = 0.2
    """The entropy coefficient when it is not tuned."""
    n_critics: Count = 5
    """Quantile critics."""
    n_quantiles: Count = 25
    """Quantiles per critic."""
    top_quantiles_to_drop_per_net: NonNegativeInt = 2
    """Quantiles dropped from the top of the pooled target, per critic."""

    def check(self) -> None:
        super().check()
        if self.top_quantiles_to_drop_per_net >= self.n_quantiles:
            raise UsageError(
                f"--top-quantiles-to-drop-per-net {self.top_quantiles_to_drop_per_net} must be "
                f"below --n-quantiles {self.n_quantiles}: the target would keep no quantile"
            )


class QuantileCritics(nn.Module):
    """`count` independent ReLU MLPs of (s, a), each giving `n` quantiles of the return."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], count: int, n: int) -> None:
        super().__init__()
        self.nets = nn.ModuleList(relu_mlp(in_dim, hidden, n) for _ in range(count))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(batch, critics, quantiles)."""
        x = torch.cat((obs, action), -1)
        return torch.stack([net(x) for net in self.nets], 1)


class TQCActorCritic(SquashedGaussianActorCritic):
    """SAC's squashed Gaussian actor (rlstore/continuous_networks.py) with quantile
    critics in place of its twin Q critics."""

    SPEC_NAME = "tqc_actor_critic"

    def __init__(
        self,
        low: Sequence[float],
        high: Sequence[float],
        hidden: tuple[int, ...],
        encoder: nn.Module,
        n_critics: int,
        n_quantiles: int,
    ) -> None:
        super().__init__(0, low, high, hidden, encoder)
        self.n_critics, self.n_quantiles = n_critics, n_quantiles
        in_dim = self.encoder.out_dim + len(low)
        self.critic = QuantileCritics(in_dim, self.hidden, n_critics, n_quantiles)

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Each critic's Q at (obs, action), the mean of its quantiles: (batch, critics)."""
        return self.critic(self.encoder(obs), action.float()).mean(-1)

    def spec_args(self) -> dict:
        quantiles = {"n_critics": self.n_critics, "n_quantiles": self.n_quantiles}
        return super().spec_args() | quantiles

    @classmethod
    def from_spec(cls, spec: dict) -> TQCActorCritic:
        encoder = encoder_from_description(description_of_spec(spec))
        low, high, hidden = spec["action_low"], spec["action_high"], tuple(spec["hidden"])
        return cls(low, high, hidden, encoder, spec["n_critics"], spec["n_quantiles"])


def truncated_target(
    next_quantiles: torch.Tensor,
    next_log_prob: torch.Tensor,
    batch: ReplayBatch,
    alpha: torch.Tensor,
    drop_per_net: int,
) -> torch.Tensor:
    """TQC's target quantiles (batch, kept): the target critics' quantiles at (s', a')
    (batch, critics, n) pooled and sorted, the top drop_per_net * critics dropped, then
    r + discount * (1 - terminated) * (quantile - alpha * log pi(a'|s'))."""
    critics, n = next_quantiles.shape[1:]
    pooled, _ = next_quantiles.reshape(len(next_quantiles), -1).sort(-1)
    kept = pooled[:, : critics * (n - drop_per_net)]
    soft = kept - alpha * next_log_prob[:, None]
    discounts = batch.discounts.masked_fill(batch.terminated, 0.0)
    return batch.rewards[:, None] + discounts[:, None] * soft


def critic_loss(quantiles: torch.Tensor, target: torch.Tensor, fast: bool = False) -> torch.Tensor:
    """The quantile Huber loss of every critic's quantiles (batch, critics, n) against the
    pooled target (batch, kept), averaged over batch, critics, quantiles and targets.
    `fast`: the same (up to rounding) by sorted targets, every critic's quantiles of a
    sample against its one target row (sorted_quantile_huber_loss)."""
    batch, critics, n = quantiles.shape
    if fast:
        taus = quantile_midpoints(n, quantiles.device).repeat(critics)
        per_sample = sorted_quantile_huber_loss(quantiles.reshape(batch, -1), target, taus)
        return per_sample.mean() / (critics * n)
    per_critic = quantile_huber_loss(
        quantiles.reshape(batch * critics, n),
        target.repeat_interleave(critics, 0),
        quantile_midpoints(n, quantiles.device),
    )
    return per_critic.mean() / n


def actor_loss(
    agent: TQCActorCritic, obs: torch.Tensor, action: torch.Tensor, log_prob: torch.Tensor, alpha
) -> torch.Tensor:
    """E[alpha log pi(a|s) - Q(s, a)], Q the mean of every critic's quantiles."""
    q = agent.critic(agent.encoder(obs), action).mean((1, 2))
    return (alpha * log_prob - q).mean()


def gradient_step(
    number: int,
    agent: TQCActorCritic,
    target_critic: nn.Module,
    entropy: EntropyCoefficient,
    optimizers: dict[str, torch.optim.Optimizer],
    buffer: ReplayBuffer,
    cfg: TQCConfig,
    target_entropy: float,
) -> dict[str, torch.Tensor]:
    """Gradient step `number` (1, 2, ...) on a replay batch: the entropy coefficient (at
    the actor's steps), the critics, the actor (every policy_frequency-th), then the soft
    target update. Returns what it logs, as tensors."""
    batch = buffer.sample(cfg.batch_size)
    alpha = entropy.alpha  # this step's, before its own update (sb3-contrib's order)
    logged = {}
    actor_due = number % cfg.policy_frequency == 0
    if actor_due:
        action_pi, log_prob = agent.act(batch.obs)
        if "alpha" in optimizers:
            a_loss = -(entropy.log_alpha * (log_prob.detach() + target_entropy)).mean()
            optimizers["alpha"].zero_grad(set_to_none=True)
            a_loss.backward()
            optimizer_step(optimizers["alpha"])
            logged["losses/alpha_loss"] = a_loss.detach()
    with torch.no_grad():
        next_action, next_log_prob = agent.act(batch.next_obs)
        next_quantiles = target_critic(agent.encoder(batch.next_obs), next_action)
        target = truncated_target(
            next_quantiles, next_log_prob, batch, alpha, cfg.top_quantiles_to_drop_per_net
        )
    quantiles = agent.critic(agent.encoder(batch.obs), batch.actions)
    q_loss = critic_loss(quantiles, target, cfg.use_fast_paths)
    optimizers["critic"].zero_grad(set_to_none=True)
    q_loss.backward()
    optimizer_step(optimizers["critic"])
    logged |= {"losses/qf_loss": q_loss.detach(), "losses/qf_values": quantiles.detach().mean()}
    if actor_due:
        with frozen(agent.critic):
            loss = actor_loss(agent, batch.obs, action_pi, log_prob, alpha)
        optimizers["actor"].zero_grad(set_to_none=True)
        loss.backward()
        optimizer_step(optimizers["actor"])
        logged["losses/actor_loss"] = loss.detach()
    update_target(target_critic, agent.critic, cfg.tau)
    return logged


def train(
    cfg: TQCConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train TQC as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run after every vector step (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, ALGORITHM)
    check_bounded_actions(envs, cfg.env_id, ALGORITHM.name)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    agent = TQCActorCritic(
        action_space.low,
        action_space.high,
        cfg.hidden,
        encoder_for(obs_space),
        cfg.n_critics,
        cfg.n_quantiles,
    ).to(device)
    target_critic = copy.deepcopy(agent.critic)
    entropy = EntropyCoefficient(None if cfg.autotune else cfg.alpha).to(device)
    target_entropy = -float(np.prod(action_space.shape))  # -dim(A), SAC's heuristic
    lr = cfg.learning_rate
    optimizers = {
        "actor": torch.optim.Adam(agent.actor.parameters(), lr=lr, fused=True),
        "critic": torch.optim.Adam(agent.critic.parameters(), lr=lr, fused=True),
    }
    if cfg.autotune:
        optimizers["alpha"] = torch.optim.Adam([entropy.log_alpha], lr=lr)
    buffer = make_replay_buffer(cfg, envs, device)
    obs, _ = envs.reset(seed=cfg.seed)
    spec = policy_spec(agent, obs_space, action_space)
    parts = {f"{name}_optimizer": optimizer for name, optimizer in optimizers.items()}
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
    name="tqc",
    summary="Truncated Quantile Critics: SAC with quantile critics, the top of their pooled "
    "target dropped (continuous actions)",
    config=TQCConfig,
    train=train,
    action_spaces=(spaces.Box,),
    defaults="sb3-contrib's TQC (five critics, as the paper)",
    networks=(TQCActorCritic,),
    image_observations=False,
)
