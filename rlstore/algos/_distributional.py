"""What the distributional and noisy value methods share (c51.py, qrdqn.py, rainbow.py):
their config base, the Q-network that gives a return distribution per action, the noisy
linear layer, C51's projected Bellman target and the quantile Huber loss.

Each loss piece is a pure function of tensors, tested against a naive per-element
reference (tests/test_distributional.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlstore.action_heads import masked_q
from rlstore.algos.dqn import QLearningConfig
from rlstore.config import Positive
from rlstore.encoders import description_of_spec, encoder_from_description
from rlstore.host_networks import GreedyActor, SequentialRunner
from rlstore.parts import as_tensors


@dataclass
class DistributionalConfig(QLearningConfig):
    """What C51, QR-DQN and Rainbow add to DQN's options."""

    adam_eps: Positive | None = None
    """Adam's epsilon; unset: 0.01 / batch_size, as CleanRL's c51.py and sb3-contrib's
    QRDQN set it."""

    def optimizer_eps(self) -> float:
        return 0.01 / self.batch_size if self.adam_eps is None else self.adam_eps


# -- the noisy linear layer ----------------------------------------------------------------


def factorized(noise: torch.Tensor) -> torch.Tensor:
    """f(x) = sign(x) sqrt(|x|), which factorized noise applies to its Gaussian draws."""
    return noise.sign() * noise.abs().sqrt()


class NoisyLinear(nn.Module):
    """A linear layer with learnt, factorized Gaussian noise on its weights and biases
    (Fortunato et al. 2018, as Rainbow uses it): w = mu_w + sigma_w * f(e_out) f(e_in)^T,
    b = mu_b + sigma_b * f(e_out), with e ~ N(0, 1) drawn by `reset_noise`. In eval mode
    the layer is its means alone, so a saved policy acts without noise."""

    def __init__(self, in_features: int, out_features: int, sigma_0: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        nn.init.uniform_(self.weight_mu, -bound, bound)
        nn.init.uniform_(self.bias_mu, -bound, bound)
        sigma = sigma_0 / math.sqrt(in_features)
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma))
        # The noise in use: kept in the state dict, so that a resumed run goes on with it.
        self.register_buffer("weight_epsilon", torch.zeros(out_features, in_features))
        self.register_buffer("bias_epsilon", torch.zeros(out_features))
        self.reset_noise()

    def reset_noise(self) -> None:
        """Draw new noise (from torch's global generator, which checkpoints keep)."""
        device = self.weight_mu.device
        e_in = factorized(torch.randn(self.in_features, device=device))
        e_out = factorized(torch.randn(self.out_features, device=device))
        self.weight_epsilon.copy_(torch.outer(e_out, e_in))
        self.bias_epsilon.copy_(e_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * self.weight_epsilon
        return F.linear(x, weight, self.bias_mu + self.bias_sigma * self.bias_epsilon)


# -- the network ---------------------------------------------------------------------------


class DistributionalQNetwork(nn.Module):
    """A Q-network that gives n numbers per action: C51's atom logits ("categorical", on
    `n` atoms evenly spaced on [v_min, v_max]) or QR-DQN's quantiles ("quantile", at the
    midpoints (2i + 1) / 2n). Q(s, a) is their expectation: the atoms weighted by their
    probabilities, or the mean of the quantiles.

    Layout: the observation's encoder, hidden[:-1] as plain ReLU layers, then a stream
    of the last hidden width and its output layer: one, or two with `dueling` (value and
    advantage, combined as V + A - mean(A) per atom or quantile, as CleanRL's Rainbow
    does), their layers noisy with `noisy` (rainbow_atari.py's heads)."""

    SPEC_NAME = "distributional_q_network"

    def __init__(
        self,
        num_actions: int,
        kind: Literal["categorical", "quantile"],
        n: int,
        hidden: tuple[int, ...],
        encoder: nn.Module,
        dueling: bool = False,
        noisy: bool = False,
        v_min: float = -10.0,
        v_max: float = 10.0,
    ) -> None:
        super().__init__()
        self.num_actions, self.kind, self.n = num_actions, kind, n
        self.hidden, self.dueling, self.noisy = tuple(hidden), dueling, noisy
        self.v_min, self.v_max = float(v_min), float(v_max)
        self.encoder = encoder
        layers: list[nn.Module] = []
        width = encoder.out_dim
        for out in self.hidden[:-1]:
            layers += [nn.Linear(width, out), nn.ReLU()]
            width = out
        self.body = nn.Sequential(*layers)
        linear = NoisyLinear if noisy else nn.Linear

        def stream(outputs: int) -> nn.Sequential:
            return nn.Sequential(
                linear(width, self.hidden[-1]), nn.ReLU(), linear(self.hidden[-1], outputs)
            )

        self.advantage = stream(num_actions * n)
        self.value = stream(n) if dueling else None
        if not noisy:  # the plain MLP, for numpy gradient steps (rlstore/host_updates.py)
            self.advantage_path = SequentialRunner([*self.body, *self.advantage])
        self.register_buffer("support", torch.linspace(self.v_min, self.v_max, n))

    def forward(self, obs: Any) -> torch.Tensor:
        """(batch, num_actions, n): atom logits (categorical) or quantiles."""
        x = self.body(self.encoder(obs))
        out = self.advantage(x).view(-1, self.num_actions, self.n)
        if self.value is None:
            return out
        return self.value(x).view(-1, 1, self.n) + out - out.mean(1, keepdim=True)

    def q_of(self, out: torch.Tensor) -> torch.Tensor:
        """Q-values (..., num_actions) of forward's output."""
        if self.kind == "categorical":
            return (out.softmax(-1) * self.support).sum(-1)
        return out.mean(-1)

    def q_values(self, obs: Any) -> torch.Tensor:
        """Q(obs, a) for every action, shape (batch, num_actions)."""
        return self.q_of(self(obs))

    def greedy_action(self, obs: Any, masks: np.ndarray | None = None) -> np.ndarray:
        """argmax Q (over the actions `masks` allows, where given) for a batch of host
        observations; noisy layers act with their current noise while training."""
        device = self.support.device
        with torch.inference_mode():
            q = self.q_values(as_tensors(obs, device))
            allowed = None if masks is None else torch.as_tensor(masks, device=device)
            return masked_q(q, allowed).argmax(-1).cpu().numpy()

    def greedy_actor(self) -> GreedyActor | None:
        """greedy_action in numpy (a fast path) for a plain MLP (no noisy layers; a dueling
        head only with quantiles, where the advantages' means order the actions as Q does)
        whose encoder has a numpy twin; None elsewhere."""
        categorical = self.kind == "categorical"
        if self.noisy or (self.dueling and categorical) or not hasattr(self.encoder, "host"):
            return None
        support = self.support if categorical else None
        return GreedyActor(self.advantage_path, True, self.encoder, self.n, support)

    def reset_noise(self) -> None:
        """New noise in every noisy layer (none without `noisy`)."""
        for layer in self.modules():
            if isinstance(layer, NoisyLinear):
                layer.reset_noise()

    def spec_args(self) -> dict:
        return {
            "action_dim": self.num_actions,
            "kind": self.kind,
            "n": self.n,
            "hidden": list(self.hidden),
            "dueling": self.dueling,
            "noisy": self.noisy,
            "v_min": self.v_min,
            "v_max": self.v_max,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> DistributionalQNetwork:
        encoder = encoder_from_description(description_of_spec(spec))
        keys = ("kind", "n", "dueling", "noisy", "v_min", "v_max")
        kwargs = {k: spec[k] for k in keys}
        return cls(spec["action_dim"], hidden=tuple(spec["hidden"]), encoder=encoder, **kwargs)


# -- the losses ----------------------------------------------------------------------------


def categorical_projection(
    next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """C51's target (Bellemare et al. 2017): the distribution r + discount * z, z ~
    next_probs on `support`, projected back onto the support. Each shifted atom, clipped
    to [v_min, v_max], splits its mass between its two neighbouring atoms in proportion
    to its closeness (all of it to an atom it lands on).

    next_probs (B, n); rewards and discounts (B,), a discount 0 where the episode
    terminated (the target is then all mass at r). Returns (B, n), rows summing to 1."""
    n = support.shape[0]
    v_min, v_max = support[0], support[-1]
    shifted = (rewards[:, None] + discounts[:, None] * support).clamp(v_min, v_max)
    position = (shifted - v_min) / ((v_max - v_min) / (n - 1))  # in atoms, in [0, n - 1]
    lower, upper = position.floor().clamp(0, n - 1), position.ceil().clamp(0, n - 1)
    to_lower = (upper - position) + (lower == upper).to(position.dtype)  # all on an atom
    to_upper = position - lower
    target = torch.zeros_like(next_probs)
    target.scatter_add_(1, lower.long(), next_probs * to_lower)
    target.scatter_add_(1, upper.long(), next_probs * to_upper)
    return target


def quantile_midpoints(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The quantile fractions tau_i = (2i + 1) / 2n that QR-DQN's outputs estimate."""
    return (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n


def quantile_huber_loss(
    predicted: torch.Tensor, target: torch.Tensor, taus: torch.Tensor, kappa: float = 1.0
) -> torch.Tensor:
    """The quantile regression Huber loss (Dabney et al. 2018), per sample (B,):

        u_ij = target_j - predicted_i
        rho_ij = |tau_i - 1{u_ij < 0}| * huber_kappa(u_ij) / kappa
        loss = sum_i mean_j rho_ij

    predicted (B, N) at fractions taus (N,); target (B, M), no gradient through it. (Fused
    torch ops on the (B, N, M) pairs: the formula written out elementwise takes 4-5 times
    as long on TQC's batches.)"""
    target = target.detach()[:, None, :].expand(-1, predicted.shape[1], -1)  # (B, N, M)
    predicted = predicted[:, :, None].expand_as(target)
    huber = F.huber_loss(predicted, target, reduction="none", delta=kappa)
    weight = torch.where(target < predicted, 1 - taus[None, :, None], taus[None, :, None])
    return (weight * huber).mean(-1).sum(-1) / kappa


class SortedQuantileHuberLoss(torch.autograd.Function):
    """quantile_huber_loss in O(N log M) per sample instead of O(N M): the fast path of
    TQC's critic loss, whose (batch x critics, 25, 115) pairs made it over half the
    gradient step (scripts/benchmark_methods.py). Equal to the reference up to rounding
    (tests/test_distributional.py).

    With each sample's targets sorted, the targets a prediction p_i sees below p_i - kappa,
    in [p_i - kappa, p_i), in [p_i, p_i + kappa] and above p_i + kappa are four runs of
    the sorted row, found by binary search; over each run the Huber term is linear or
    quadratic in the targets, so its sum (and the sum of its derivative in p_i) comes from
    prefix sums of t and t^2. The sums are in float64: the quadratic runs' sum
    s2 - 2 p s1 + n p^2 would cancel in float32 at returns in the thousands."""

    @staticmethod
    def forward(ctx, predicted, target, taus, kappa):  # noqa: ANN001, ANN205 (autograd's)
        p = predicted.double()
        t = target.detach().double().sort(-1).values
        zero = t.new_zeros(len(t), 1)
        s1 = torch.cat((zero, t.cumsum(-1)), -1)  # (B, M + 1): sums of the first k targets
        s2 = torch.cat((zero, t.square().cumsum(-1)), -1)
        a = torch.searchsorted(t, p - kappa)  # below p - kappa: [0, a)
        b = torch.searchsorted(t, p)  # in [p - kappa, p): [a, b)
        c = torch.searchsorted(t, p + kappa, right=True)  # in [p, p + kappa]: [b, c); above
        m = t.shape[-1]
        bounds = (torch.zeros_like(a), a, b, c, torch.full_like(a, m))
        runs = list(zip(bounds[:-1], bounds[1:], strict=True))  # the four runs, in order
        count = [(hi - lo).double() for lo, hi in runs]
        sum_t = [s1.gather(-1, hi) - s1.gather(-1, lo) for lo, hi in runs]
        sum_t2 = [s2.gather(-1, hi) - s2.gather(-1, lo) for lo, hi in runs]

        def quadratic(run: int) -> torch.Tensor:  # the sum of (t - p)^2 / 2 over a run
            return 0.5 * (sum_t2[run] - 2 * p * sum_t[run] + count[run] * p * p)

        # Huber's linear arm, kappa (|t - p| - kappa / 2), below and above
        below = kappa * (count[0] * (p - kappa / 2) - sum_t[0]) + quadratic(1)
        above = quadratic(2) + kappa * (sum_t[3] - count[3] * (p + kappa / 2))
        tau = taus.double()[None, :]  # targets below p weigh 1 - tau, the others tau
        loss = ((1 - tau) * below + tau * above).sum(-1) / (m * kappa)
        # d/dp of the Huber terms: kappa below p - kappa, p - t within kappa, -kappa above
        d_below = kappa * count[0] + count[1] * p - sum_t[1]
        d_above = count[2] * p - sum_t[2] - kappa * count[3]
        ctx.save_for_backward(((1 - tau) * d_below + tau * d_above) / (m * kappa))
        return loss.to(predicted.dtype)

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: ANN001, ANN205
        (grad,) = ctx.saved_tensors
        return (grad_loss[:, None].double() * grad).to(grad_loss.dtype), None, None, None


def sorted_quantile_huber_loss(
    predicted: torch.Tensor, target: torch.Tensor, taus: torch.Tensor, kappa: float = 1.0
) -> torch.Tensor:
    """quantile_huber_loss (the same arguments and result, up to rounding) by sorted
    targets and prefix sums: SortedQuantileHuberLoss."""
    return SortedQuantileHuberLoss.apply(predicted, target, taus, kappa)
