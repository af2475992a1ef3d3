"""The networks' fast paths: the actor-critic's and Q-network's forward passes without
nn.Module's per-call dispatch (SequentialRunner), and in numpy on views of the live
parameters when they lie in host memory (HostActorCritic acts, GreedyActor takes the
argmax Q). For the small MLPs of classic and continuous control one torch call costs more
than its arithmetic. Each is tested against the module calls it replaces
(tests/test_fast.py); docs/maintainers/fast-paths.md says what each buys."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlstore.action_heads import MASKED_LOGIT, MultiCategoricalHead, masked_q
from rlstore.parts import as_tensors, first_part

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


ACTIVATIONS: dict[type, Callable[[torch.Tensor], torch.Tensor]] = {
    nn.Tanh: torch.tanh,
    nn.ReLU: torch.relu,
}


class SequentialRunner:
    """Calls Linear layers and Tanh/ReLU activations in order: the arithmetic of
    nn.Sequential(*layers)(x), as a loop of F.linear and activation calls.

    It holds the layers' parameters and takes them again when the module's parameters are
    replaced (moving to or from the meta device does that; `.to(dtype)` and
    load_state_dict keep them), checking the first weight on each call.
    """

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        self.linears = [m for m in layers if isinstance(m, nn.Linear)]
        self.activations = [ACTIVATIONS[type(m)] for m in layers if not isinstance(m, nn.Linear)]
        kinds = [isinstance(m, nn.Linear) for m in layers]
        if kinds != [True, False] * (len(self.linears) - 1) + [True]:
            raise ValueError("layers must alternate Linear and Tanh/ReLU, ending with a Linear")
        # The first Linear's parameter table, read (never written): a dict lookup per call
        # tells whether its weight was replaced, where `.weight` costs a Module.__getattr__.
        self._first = self.linears[0]._parameters
        self._params = [(m.weight, m.bias) for m in self.linears]

    def parameters(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (weight, bias) of each Linear, as the module holds them now."""
        if self._params[0][0] is not self._first["weight"]:
            self._params = [(m.weight, m.bias) for m in self.linears]
        return self._params

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        params = self._params
        if params[0][0] is not self._first["weight"]:  # (parameters() inlined: a hot call)
            params = self.parameters()
        for (weight, bias), act in zip(params, self.activations, strict=False):
            x = act(F.linear(x, weight, bias))
        weight, bias = params[-1]
        return F.linear(x, weight, bias)


class HostViews:
    """numpy views (W^T, b) of the parameters of a SequentialRunner's Linear layers, when
    they lie in host memory; taken again when the parameters are replaced or their storage
    moves (the optimizer and load_state_dict update them in place: the views follow)."""

    def __init__(self, path: SequentialRunner, use_numpy: bool = True) -> None:
        self.path, self.use_numpy = path, use_numpy
        self.weight: torch.Tensor | None = None  # the first weight when the views were taken
        self._pointer = 0  # and where its data lay (`.to(dtype)` keeps the tensor, not the data)
        self._views: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The views, or [] when the parameters are not in host memory."""
        params = self.path.parameters()
        weight = params[0][0]
        if weight is not self.weight or weight.data_ptr() != self._pointer:
            self.weight, self._pointer = weight, weight.data_ptr()
            on_host = weight.device.type == "cpu"
            self._views = (
                [(w.detach().numpy().T, b.detach().numpy()) for w, b in params]
                if on_host and self.use_numpy
                else []
            )
        return self._views


@functools.cache
def _rows(n: int) -> np.ndarray:
    """0..n-1, for picking one column per row (array[_rows(n), columns]); cached, read-only."""
    rows = np.arange(n)
    rows.flags.writeable = False
    return rows


def numpy_mlp(x: np.ndarray, views: list[tuple[np.ndarray, np.ndarray]], tanh: bool) -> np.ndarray:
    """The MLP of `views` on a float32 batch, Tanh or ReLU between the layers."""
    for weight, bias in views[:-1]:
        x = x @ weight
        x += bias
        if tanh:
            np.tanh(x, out=x)
        else:
            np.maximum(x, 0.0, out=x)
    weight, bias = views[-1]
    return x @ weight + bias


def host_features(obs: np.ndarray, encoder: Any = None) -> np.ndarray:
    """The float32 rows an MLP takes: `encoder.host(obs)` (a parameter-free encoder's numpy
    twin, rlstore/encoders.py), or without one the observations flattened."""
    if encoder is not None:
        return encoder.host(obs)
    return np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)


class GreedyActor:
    """argmax_a Q(s, a) for a batch of host observations, over the actions `masks` allows
    where given, as an int64 numpy array; the network's greedy_action in numpy.

    `path` is the runner from the input to the advantage head (with a dueling head V(s)
    and the mean advantage are the same for every action, so the head's argmax is Q's).
    With `outputs_per_action` n > 1 the head gives n numbers per action: quantiles whose
    mean is Q (QR-DQN), or with `support` (the n atoms' values) atom logits whose
    softmax-weighted sum of the support is Q (C51). With its parameters in host memory the
    forward runs in numpy on views of them (HostViews); on any other device, or with
    `use_numpy=False`, it runs in torch.
    """

    def __init__(
        self,
        path: SequentialRunner,
        use_numpy: bool = True,
        encoder: Any = None,
        outputs_per_action: int = 1,
        support: torch.Tensor | None = None,
    ) -> None:
        self.path, self.views = path, HostViews(path, use_numpy)
        # the Q-network's parameter-free encoder (rlstore/encoders.py); None: flattened floats
        self.encoder = encoder
        self.n, self.support = outputs_per_action, support

    def __call__(self, obs: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
        views = self.views()
        if not views:
            with torch.inference_mode():
                device = self.views.weight.device
                x = as_tensors(obs, device)
                x = x.reshape(x.shape[0], -1).float() if self.encoder is None else self.encoder(x)
                q = self._q(self.path(x), torch)
                allowed = None if masks is None else torch.as_tensor(masks, device=device)
                return masked_q(q, allowed).argmax(-1).cpu().numpy()
        q = self._q(numpy_mlp(host_features(obs, self.encoder), views, tanh=False), np)
        if masks is not None:
            q = np.where(masks, q, -np.inf)
        return q.argmax(-1)

    def _q(self, out: Any, xp: Any) -> Any:
        """Q (B, actions) up to a constant per row and a positive factor, from the head's
        output in numpy or torch (`xp`): what its argmax needs."""
        if self.n == 1:
            return out
        out = out.reshape(len(out), -1, self.n)
        if self.support is None:  # quantiles: their sum
            return out.sum(-1)
        # atom logits: the softmax's expectation of the support
        if xp is np:
            weights, support = np.exp(out - out.max(-1, keepdims=True)), self.support.numpy()
        else:
            weights, support = torch.exp(out - out.amax(-1, keepdim=True)), self.support
        return (weights * support).sum(-1) / weights.sum(-1)


class HostActorCritic:
    """ActorCritic.act for a batch of host observations, in numpy on views of the live
    parameters (HostViews): (action, log-prob, value) as numpy arrays. Sampling uses the
    formulas of sample_categorical and sample_gaussian, with numpy's global RNG (seeded by
    the run and kept in its checkpoints). For the small MLPs of classic and continuous
    control one torch call costs more than its arithmetic: numpy's calls cost less.
    Returns None when the parameters are not in host memory (the caller then uses torch).
    """

    def __init__(
        self,
        actor: SequentialRunner,
        critic: SequentialRunner,
        log_std: torch.Tensor | None,
        encoder: Any = None,
        head: Any = None,
    ) -> None:
        if any(act is not torch.tanh for act in actor.activations + critic.activations):
            raise ValueError("HostActorCritic runs Tanh MLPs (ActorCritic's)")
        self.actor, self.critic, self.log_std = HostViews(actor), HostViews(critic), log_std
        self.encoder = encoder  # parameter-free (rlstore/encoders.py); None: flattened floats
        self.head = head  # MultiDiscrete's or MultiBinary's (rlstore/action_heads.py), or None

    def value(self, obs: np.ndarray) -> np.ndarray | None:
        """V(obs) in numpy (None when the parameters are not in host memory)."""
        critic = self.critic()
        if not critic:
            return None
        return numpy_mlp(host_features(obs, self.encoder), critic, tanh=True)[:, 0]

    def __call__(
        self, obs: np.ndarray, masks: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        actor, critic = self.actor(), self.critic()
        if not actor or not critic:
            return None
        noise = self.noise(1, len(first_part(obs)))[0]
        return self.sample(obs, actor, critic, noise, masks)

    def noise(self, steps: int, num_envs: int) -> np.ndarray:
        """The random draws of `steps` calls for `num_envs` observations each, as float32
        (steps, num_envs, 1) uniforms for a categorical, one per entry for a head's
        categoricals or Bernoullis, (steps, num_envs, A) standard normals for a Gaussian:
        drawn at once, they are the numbers that one draw per step takes from numpy's
        global RNG, which leaves it in the same state."""
        if self.head is not None:
            multi = isinstance(self.head, MultiCategoricalHead)
            width = len(self.head.nvec) if multi else self.head.out_dim
            return np.random.random((steps, num_envs, width)).astype(np.float32)
        if self.log_std is None:
            return np.random.random((steps, num_envs, 1)).astype(np.float32)
        shape = (steps, num_envs, self.log_std.shape[-1])
        return np.random.standard_normal(shape).astype(np.float32)

    def sample(
        self,
        obs: np.ndarray,
        actor: list,
        critic: list,
        noise: np.ndarray,
        masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(action, log-prob, value) for `obs` with the views `actor` and `critic` (from
        self.actor() and self.critic()) and one step of `noise`; only the actions `masks`
        allows, where given (Discrete and MultiDiscrete actions)."""
        x = host_features(obs, self.encoder)
        out = numpy_mlp(x, actor, tanh=True)
        if masks is not None:  # as masked_logits
            out = np.where(masks, out, np.float32(MASKED_LOGIT))
        value = numpy_mlp(x, critic, tanh=True)[:, 0]
        head = self.head
        if head is None and self.log_std is None:
            return (*inverse_cdf_sample(out, noise, masks), value)
        if head is None:
            log_std = self.log_std.detach().numpy()
            action = out + np.exp(log_std) * noise
            log_prob = (-0.5 * np.square(noise) - log_std - np.float32(LOG_SQRT_2PI)).sum(-1)
            return action, log_prob.astype(np.float32), value
        if isinstance(head, MultiCategoricalHead):  # one categorical per entry
            bounds = np.cumsum(head.nvec)[:-1]
            parts = np.split(out, bounds, axis=1)
            part_masks = [None] * len(parts) if masks is None else np.split(masks, bounds, 1)
            sampled = [
                inverse_cdf_sample(part, noise[:, i : i + 1], part_mask)
                for i, (part, part_mask) in enumerate(zip(parts, part_masks, strict=True))
            ]
            action = np.stack([a for a, _ in sampled], -1)
            return action, np.add.reduce([lp for _, lp in sampled]), value
        # BernoulliHead: a bit is 1 where its uniform is below its probability (taken as
        # exp(log-sigmoid): no overflow for large logits)
        log_one, log_zero = -np.logaddexp(0, -out), -np.logaddexp(0, out)
        action = (noise < np.exp(log_one)).astype(np.int64)
        log_prob = np.where(action == 1, log_one, log_zero).sum(-1)
        return action, log_prob.astype(np.float32), value


def inverse_cdf_sample(
    out: np.ndarray, noise: np.ndarray, masks: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(action, log-prob) of one sample per row of a categorical of logits `out` (masked
    ones at MASKED_LOGIT already) from uniforms `noise` (B, 1), as inverse_cdf samples: the
    count of cumulative probabilities below u, taken as the first one at or above it (the
    cdf never falls), and the last (allowed) action for u above a rounded-down total; a
    masked action is never the first at or above u."""
    # (the ufuncs' own reduce/accumulate: the same sums as .max/.sum/.cumsum, with less
    # dispatch per call)
    shifted = out - np.maximum.reduce(out, axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.add.reduce(np.exp(shifted), axis=-1, keepdims=True))
    cdf = np.add.accumulate(np.exp(log_probs), axis=-1)
    if masks is None:
        cdf[:, -1] = np.inf
    else:
        cdf[~masks] = -np.inf
        last = masks.shape[1] - 1 - masks[:, ::-1].argmax(-1)
        cdf[_rows(len(cdf)), last] = np.inf
    action = (cdf >= noise).argmax(-1)
    return action, log_probs[_rows(len(action)), action]
