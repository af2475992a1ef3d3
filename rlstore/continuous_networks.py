"""The actor-critics of the continuous off-policy algorithms: SAC's squashed Gaussian actor
and TD3's (and DDPG's) deterministic one, each with its Q critics (two for the clipped
double-Q target, one for DDPG), on a parameter-free observation encoder. Same spec protocol
as rlstore/networks.py's networks."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rlstore.encoders import (
    FlatEncoder,
    description_of_spec,
    encoder_from_description,
)
from rlstore.host_networks import LOG_SQRT_2PI


def relu_mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int) -> nn.Sequential:
    """ReLU MLP with PyTorch's default init, as CleanRL's SAC and TD3 networks."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_dim, width), nn.ReLU()]
        in_dim = width
    return nn.Sequential(*layers, nn.Linear(in_dim, out_dim))


class QCritics(nn.Module):
    """One or two independent Q(s, a) MLPs, q1 and q2: two for the clipped double-Q target
    of TD3 and SAC, which takes their minimum (Fujimoto et al. 2018); one for DDPG."""

    def __init__(
        self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], count: int = 2
    ) -> None:
        super().__init__()
        if count not in (1, 2):
            raise ValueError(f"QCritics holds one or two critics, not {count}")
        self.q1 = relu_mlp(obs_dim + action_dim, hidden, 1)
        if count == 2:
            self.q2 = relu_mlp(obs_dim + action_dim, hidden, 1)
        self.count = count

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(Q1(obs, action), Q2(obs, action)), or (Q1(obs, action),) with one critic; each
        of shape (batch,)."""
        x = torch.cat((obs, action), -1)
        if self.count == 1:
            return (self.q1(x).squeeze(-1),)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def squashed_gaussian_log_prob(
    u: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """log-density of the action a = scale * tanh(u) + bias, where u ~ Normal(mean,
    exp(log_std)), summed over the action dimensions: the Gaussian's log-density of u
    minus log |da/du| = log scale + log(1 - tanh(u)^2) (the change of variables), the
    latter written as 2 (log 2 - u - softplus(-2u)), which stays finite where tanh(u)
    rounds to +-1."""
    z = (u - mean) * torch.exp(-log_std)
    gaussian = -0.5 * z.square() - log_std - LOG_SQRT_2PI
    log_det = scale.log() + 2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))
    return (gaussian - log_det).sum(-1)


class BoundedActions(nn.Module):
    """Maps [-1, 1]^d to the env's action box [low, high] (a = scale * y + bias), and
    keeps the box for the spec and for clipping."""

    def __init__(self, low: Sequence[float], high: Sequence[float]) -> None:
        super().__init__()
        low_t = torch.as_tensor(np.asarray(low, dtype=np.float32))
        high_t = torch.as_tensor(np.asarray(high, dtype=np.float32))
        self.register_buffer("low", low_t)
        self.register_buffer("high", high_t)
        self.register_buffer("scale", (high_t - low_t) / 2.0)
        self.register_buffer("bias", (high_t + low_t) / 2.0)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.scale * y + self.bias


class SquashedGaussianActorCritic(nn.Module):
    """SAC's networks (Haarnoja et al. 2018, as CleanRL's sac_continuous_action.py): a
    Gaussian actor squashed by tanh into the action box, whose log-std is bounded to
    [LOG_STD_MIN, LOG_STD_MAX] by a tanh, and twin Q critics on env-scale actions. The
    actor is one MLP whose last layer gives the mean and the unbounded log-std side by side
    (CleanRL's two heads on a shared trunk, as one Linear)."""

    SPEC_NAME = "squashed_gaussian_actor_critic"
    continuous = True
    LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

    def __init__(
        self,
        obs_dim: int,
        low: Sequence[float],
        high: Sequence[float],
        hidden: tuple[int, ...] = (256, 256),
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        action_dim, self.hidden = len(low), tuple(hidden)
        # a parameter-free encoder (vectors, one-hots), which actor and critics share
        self.encoder = FlatEncoder((obs_dim,)) if encoder is None else encoder
        obs_dim = self.encoder.out_dim
        self.actor = relu_mlp(obs_dim, hidden, 2 * action_dim)
        self.bounds = BoundedActions(low, high)
        self.critic = QCritics(obs_dim, action_dim, hidden)

    def distribution(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log-std) of the Gaussian before the squashing."""
        mean, raw_log_std = self.actor(self.encoder(obs)).chunk(2, -1)
        span = self.LOG_STD_MAX - self.LOG_STD_MIN
        return mean, self.LOG_STD_MIN + 0.5 * span * (torch.tanh(raw_log_std) + 1.0)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action in the env's box, its log-prob): one reparameterized sample per row, so
        that gradients flow through the action to the actor."""
        mean, log_std = self.distribution(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        action = self.bounds(torch.tanh(u))
        return action, squashed_gaussian_log_prob(u, mean, log_std, self.bounds.scale)

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The squashed mean, scale * tanh(mean) + bias (how SAC is evaluated)."""
        return self.bounds(torch.tanh(self.distribution(obs)[0]))

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(Q1, Q2) at (obs, action), shape (batch, 2)."""
        return torch.stack(self.critic(self.encoder(obs), action.float()), -1)

    def spec_args(self) -> dict:
        return {"action_dim": len(self.bounds.low), "continuous": True, "hidden": list(self.hidden)}

    @classmethod
    def from_spec(cls, spec: dict) -> SquashedGaussianActorCritic:
        encoder = encoder_from_description(description_of_spec(spec))
        return cls(
            0, spec["action_low"], spec["action_high"], tuple(spec["hidden"]), encoder=encoder
        )


class DeterministicActorCritic(nn.Module):
    """TD3's and DDPG's networks (Fujimoto et al. 2018, Lillicrap et al. 2016, as CleanRL's
    td3_continuous_action.py and ddpg_continuous_action.py): a deterministic actor, tanh
    into the action box, and Q critics on env-scale actions, two (TD3) or one (DDPG).
    `act` adds the exploration noise (Gaussian, `exploration_noise` times the box's
    half-width), clipped to the box."""

    SPEC_NAME = "deterministic_actor_critic"
    continuous = True

    def __init__(
        self,
        obs_dim: int,
        low: Sequence[float],
        high: Sequence[float],
        hidden: tuple[int, ...] = (256, 256),
        exploration_noise: float = 0.1,
        critics: int = 2,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        action_dim, self.hidden = len(low), tuple(hidden)
        # a parameter-free encoder (vectors, one-hots), which actor and critics share
        self.encoder = FlatEncoder((obs_dim,)) if encoder is None else encoder
        obs_dim = self.encoder.out_dim
        self.exploration_noise = exploration_noise
        self.actor = relu_mlp(obs_dim, hidden, action_dim)
        self.bounds = BoundedActions(low, high)
        self.critic = QCritics(obs_dim, action_dim, hidden, critics)

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self.bounds(torch.tanh(self.actor(self.encoder(obs))))

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:
        """(the exploring action, None: it has no log-prob)."""
        action = self.deterministic_action(obs)
        noise = torch.randn_like(action) * (self.bounds.scale * self.exploration_noise)
        return torch.clamp(action + noise, self.bounds.low, self.bounds.high), None

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """(Q1, Q2) at (obs, action), shape (batch, 2); (Q1,), shape (batch, 1), with one
        critic."""
        return torch.stack(self.critic(self.encoder(obs), action.float()), -1)

    def spec_args(self) -> dict:
        noise, critics = self.exploration_noise, self.critic.count
        return {
            "action_dim": len(self.bounds.low),
            "continuous": True,
            "hidden": list(self.hidden),
            "exploration_noise": noise,
            "critics": critics,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> DeterministicActorCritic:
        encoder = encoder_from_description(description_of_spec(spec))
        # model files written before DDPG came hold TD3's two critics and do not say so
        return cls(
            0,
            spec["action_low"],
            spec["action_high"],
            tuple(spec["hidden"]),
            spec["exploration_noise"],
            spec.get("critics", 2),
            encoder,
        )
