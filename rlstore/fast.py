"""The fast paths: what makes rlstore fast, each behind a small name, each with an
equivalence test in tests/test_fast.py; docs/maintainers/fast-paths.md says what each buys.

The networks, storage and algorithms read as the reference math and call these:

- SequentialRunner: the layers of an MLP called as plain F.linear / activation calls,
  without nn.Module's per-call dispatch (which costs more than these small products);
- sample_categorical, sample_gaussian: actions and their log-probabilities by direct
  formulas instead of torch.distributions objects;
- GreedyActor: DQN's argmax Q for host observations, in numpy when the network is on
  the CPU (one tiny forward per env step, where torch's dispatch costs most);
- HostActorCritic: PPO's and A2C's act() likewise, with sampling from numpy's RNG;
- LeanRollout: PPO's and A2C's collect steps for a LeanSyncVectorEnv and host storage,
  each env's results written straight into the storage (the general calls' checks and
  batched bookkeeping cost a third of a step of 4 small envs);
- LeanSyncVectorEnv: envs stepped in turn into preallocated arrays (Gymnasium's generic
  SyncVectorEnv spends more per step on space dispatch and copies than CartPole itself);
- OneEnvDQNStep: DQN's act, env step, replay write and episode count for one env as a few
  scalar writes (with one env, the general calls' batched checks cost more than the env);
- flush_denormals: DQN's Adam moments of dead ReLU units decay into denormal floats,
  where CPU arithmetic is several times slower.

Most do the same arithmetic, in the same order, as the plain version they replace, and
their tests ask for equal bits. HostActorCritic and the Host*Step updates do not: they
compute in numpy's float32 kernels (and HostActorCritic samples from numpy's RNG), equal
to torch's to rounding, and their tests say so.
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from torch import nn
from torch.nn import functional as F

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


def sample_categorical(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(action, log-prob) of one sample per row of Categorical(logits=logits), by inverse
    CDF: the first action whose cumulative probability exceeds a uniform draw."""
    log_probs = logits.log_softmax(-1)
    u = torch.rand(logits.shape[0], 1, device=logits.device)
    below = (log_probs.exp().cumsum(-1) < u).sum(-1, keepdim=True)
    action = below.clamp_(max=logits.shape[-1] - 1)  # u above a rounded-down total
    return action.squeeze(-1), log_probs.gather(-1, action).squeeze(-1)


def sample_gaussian(mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(action, log-prob) of one sample of Normal(mean, exp(log_std)), summed over the
    action dimensions; the sample is not clipped."""
    noise = torch.randn_like(mean)
    action = mean + log_std.exp() * noise
    return action, (-0.5 * noise.square() - log_std - LOG_SQRT_2PI).sum(-1)


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


class GreedyActor:
    """argmax_a of a Q-network's advantage head for a batch of host observations, as an
    int64 numpy array (with a dueling head V(s) and the mean advantage are the same for
    every action, so this is the argmax of Q).

    `path` is the runner from the input to the advantage head. With its parameters in
    host memory the forward runs in numpy on views of them (HostViews); on any other
    device, or with `use_numpy=False`, it runs in torch.
    """

    def __init__(self, path: SequentialRunner, use_numpy: bool = True) -> None:
        self.path, self.views = path, HostViews(path, use_numpy)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        views = self.views()
        if not views:
            with torch.inference_mode():
                x = torch.as_tensor(obs, device=self.views.weight.device)
                x = self.path(x.reshape(x.shape[0], -1).float())
                return x.argmax(-1).cpu().numpy()
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        return numpy_mlp(x, views, tanh=False).argmax(-1)


class HostActorCritic:
    """ActorCritic.act for a batch of host observations, in numpy on views of the live
    parameters (HostViews): (action, log-prob, value) as numpy arrays. Sampling uses the
    formulas of sample_categorical and sample_gaussian, with numpy's global RNG (seeded by
    the run and kept in its checkpoints). For the small MLPs of classic and continuous
    control one torch call costs more than its arithmetic: numpy's calls cost less.
    Returns None when the parameters are not in host memory (the caller then uses torch).
    """

    def __init__(
        self, actor: SequentialRunner, critic: SequentialRunner, log_std: torch.Tensor | None
    ) -> None:
        if any(act is not torch.tanh for act in actor.activations + critic.activations):
            raise ValueError("HostActorCritic runs Tanh MLPs (ActorCritic's)")
        self.actor, self.critic, self.log_std = HostViews(actor), HostViews(critic), log_std

    def value(self, obs: np.ndarray) -> np.ndarray | None:
        """V(obs) in numpy (None when the parameters are not in host memory)."""
        critic = self.critic()
        if not critic:
            return None
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        return numpy_mlp(x, critic, tanh=True)[:, 0]

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        actor, critic = self.actor(), self.critic()
        if not actor or not critic:
            return None
        return self.sample(obs, actor, critic, self.noise(1, len(obs))[0])

    def noise(self, steps: int, num_envs: int) -> np.ndarray:
        """The random draws of `steps` calls for `num_envs` observations each, as float32
        (steps, num_envs, 1) uniforms for a categorical, (steps, num_envs, A) standard
        normals for a Gaussian: drawn at once, they are the numbers that one draw per step
        takes from numpy's global RNG, which leaves it in the same state."""
        if self.log_std is None:
            return np.random.random((steps, num_envs, 1)).astype(np.float32)
        shape = (steps, num_envs, self.log_std.shape[-1])
        return np.random.standard_normal(shape).astype(np.float32)

    def sample(
        self, obs: np.ndarray, actor: list, critic: list, noise: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(action, log-prob, value) for `obs` with the views `actor` and `critic` (from
        self.actor() and self.critic()) and one step of `noise`."""
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        out = numpy_mlp(x, actor, tanh=True)
        value = numpy_mlp(x, critic, tanh=True)[:, 0]
        if self.log_std is None:  # inverse CDF of the softmax, as sample_categorical
            # (the ufuncs' own reduce/accumulate: the same sums as .max/.sum/.cumsum, with
            # less dispatch per call)
            shifted = out - np.maximum.reduce(out, axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.add.reduce(np.exp(shifted), axis=-1, keepdims=True))
            cdf = np.add.accumulate(np.exp(log_probs), axis=-1)
            # The count of cumulative probabilities below u, as the first one at or above
            # it (the cdf never falls), and the last action for u above a rounded-down total
            cdf[:, -1] = np.inf
            action = (cdf >= noise).argmax(-1)
            log_prob = log_probs[_rows(len(action)), action]
            return action, log_prob, value
        log_std = self.log_std.detach().numpy()
        action = out + np.exp(log_std) * noise
        log_prob = (-0.5 * np.square(noise) - log_std - np.float32(LOG_SQRT_2PI)).sum(-1)
        return action, log_prob.astype(np.float32), value


class _ActorCriticPass:
    """The forward pass of an ActorCritic's two Tanh MLPs on a minibatch, in numpy (log-probs
    of the taken actions, entropies, values), and the backward pass from the loss's
    derivatives with respect to them: what HostPPOStep and HostA2CStep share."""

    def __init__(self, agent: nn.Module, actor: list, critic: list, obs, actions) -> None:
        self.agent, self.actor, self.critic = agent, actor, critic
        self.obs = obs
        self.actor_acts, out = _forward(obs, actor)
        self.critic_acts, value = _forward(obs, critic)
        self.value = value[:, 0]
        B = len(obs)
        if agent.continuous:
            self.log_std = agent.actor_logstd.detach().numpy()[0]
            self.std = np.exp(self.log_std)
            self.z = (actions - out) / self.std
            self.log_prob = (
                -0.5 * np.square(self.z) - self.log_std - np.float32(LOG_SQRT_2PI)
            ).sum(-1)
            entropy = (0.5 + LOG_SQRT_2PI + self.log_std).sum()
            self.entropy = np.full(B, entropy, dtype=np.float32)
        else:
            self.actions = actions.astype(np.int64)
            shifted = out - out.max(-1, keepdims=True)
            self.log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            self.probs = np.exp(self.log_probs)
            self.log_prob = self.log_probs[_rows(B), self.actions]
            self.entropy = -(self.probs * self.log_probs).sum(-1)

    def gradients(self, d_log_prob: np.ndarray, d_value: np.ndarray, ent_coef: float) -> dict:
        """Gradients of loss = f(log_prob, value) - ent_coef * mean(entropy), given
        d f / d log_prob and d f / d value per row."""
        agent, B, grads = self.agent, len(self.obs), {}
        d_log_prob = d_log_prob.astype(np.float32)
        if agent.continuous:
            d_out = d_log_prob[:, None] * self.z / self.std
            d_log_std = (d_log_prob[:, None] * (np.square(self.z) - 1)).sum(0)
            d_log_std -= ent_coef  # d(-ent_coef * mean entropy) / d log_std
            grads[agent.actor_logstd] = d_log_std[None].astype(np.float32)
        else:
            one_hot = np.zeros_like(self.probs)
            one_hot[_rows(B), self.actions] = 1.0
            d_out = d_log_prob[:, None] * (one_hot - self.probs)
            # d entropy / d logits = -p (log p + H); the loss has -ent_coef * mean(H)
            d_out += ent_coef / B * self.probs * (self.log_probs + self.entropy[:, None])
        _backward(self.obs, self.actor_acts, self.actor, d_out.astype(np.float32),
                  agent.actor_path, grads)  # fmt: skip
        _backward(self.obs, self.critic_acts, self.critic, d_value.astype(np.float32)[:, None],
                  agent.critic_path, grads)  # fmt: skip
        return grads


def _minibatch(batch: Any, cfg: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(observations as float32 rows, actions, advantages normalized as configured)."""
    obs = batch.obs.numpy().reshape(len(batch.obs), -1).astype(np.float32, copy=False)
    advantages = batch.advantages.numpy()
    if cfg.norm_adv and len(obs) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
    return obs, batch.actions.numpy(), advantages


def _tie_weights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """d max(a, b) / d a: 1 where a is larger, 1/2 on a tie (as torch), else 0."""
    return np.where(a > b, 1.0, np.where(a == b, 0.5, 0.0))


class _ActorCriticStep:
    """What the numpy update steps of an ActorCritic hold: the agent, its optimizer, and
    numpy views of the actor's and critic's parameters."""

    def __init__(self, agent: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.agent, self.optimizer = agent, optimizer
        self.actor, self.critic = HostViews(agent.actor_path), HostViews(agent.critic_path)


class HostPPOStep(_ActorCriticStep):
    """One PPO minibatch step in numpy, for an ActorCritic whose parameters are in host
    memory and a torch Adam optimizer: the loss of algos/ppo.py's ppo_loss with its
    gradient written out by hand (backpropagation through the two Tanh MLPs), gradient
    clipping as clip_grad_norm_, and Adam's update applied to the parameters and to the
    optimizer's own state through numpy views (so checkpoints and the torch path see the
    same optimizer). For these small MLPs a step is ~40 torch calls and an autograd graph;
    numpy's calls cost a fraction. float32 throughout: equal to the torch step to rounding.
    """

    @staticmethod
    def supports(agent: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """An ActorCritic in host memory and a plain Adam (adam_in_host_memory)."""
        return getattr(agent, "act_on_host", None) is not None and adam_in_host_memory(optimizer)

    def __call__(self, batch: Any, cfg: Any, diagnostics: bool = True) -> dict[str, torch.Tensor]:
        obs, actions, advantages = _minibatch(batch, cfg)
        run = _ActorCriticPass(self.agent, self.actor(), self.critic(), obs, actions)
        B, clip = len(obs), cfg.clip_coef
        old_value, returns = batch.values.numpy(), batch.returns.numpy()
        log_ratio = run.log_prob - batch.log_probs.numpy()
        ratio = np.exp(log_ratio)
        unclipped, clipped = -advantages * ratio, -advantages * np.clip(ratio, 1 - clip, 1 + clip)
        policy_loss = np.maximum(unclipped, clipped).mean()
        error = run.value - returns
        if cfg.clip_vloss:
            delta = run.value - old_value
            clipped_error = old_value + np.clip(delta, -clip, clip) - returns
            value_loss = 0.5 * np.maximum(np.square(error), np.square(clipped_error)).mean()
        else:
            value_loss = 0.5 * np.square(error).mean()
        entropy_mean = run.entropy.mean()

        # max passes the gradient to the larger branch (half each on a tie, as torch);
        # clip passes it inside its range, bounds included.
        inside = (ratio >= 1 - clip) & (ratio <= 1 + clip)
        d_ratio = (
            -advantages
            / B
            * (_tie_weights(unclipped, clipped) + _tie_weights(clipped, unclipped) * inside)
        )
        scale = cfg.vf_coef * 0.5 / B
        if cfg.clip_vloss:
            e1, e2 = np.square(error), np.square(clipped_error)
            w1, w2 = _tie_weights(e1, e2), _tie_weights(e2, e1) * (np.abs(delta) <= clip)
            d_value = scale * (w1 * 2 * error + w2 * 2 * clipped_error)
        else:
            d_value = scale * 2 * error
        grads = run.gradients(d_ratio * ratio, d_value, cfg.ent_coef)
        FlatAdam.of(self.optimizer).step(grads, cfg.max_grad_norm)

        loss = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
        losses = {"losses/policy_loss": policy_loss, "losses/value_loss": value_loss,
                  "losses/entropy": entropy_mean, "loss": loss}  # fmt: skip
        if diagnostics:
            losses["losses/old_approx_kl"] = (-log_ratio).mean()
            losses["losses/approx_kl"] = ((ratio - 1) - log_ratio).mean()
            losses["losses/clipfrac"] = (np.abs(ratio - 1) > clip).astype(np.float32).mean()
        return {k: torch.tensor(float(v)) for k, v in losses.items()}


class HostA2CStep(_ActorCriticStep):
    """A2C's update in numpy, as HostPPOStep: algos/a2c.py's a2c_loss with its gradient by
    hand, clipping, and torch RMSprop's arithmetic on the parameters and its state."""

    @staticmethod
    def supports(agent: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """An ActorCritic in host memory and a plain RMSprop (no momentum, not centered)."""
        return getattr(agent, "act_on_host", None) is not None and plain_in_host_memory(
            optimizer, torch.optim.RMSprop, "weight_decay", "momentum", "centered"
        )

    def __call__(self, batch: Any, cfg: Any) -> dict[str, torch.Tensor]:
        obs, actions, advantages = _minibatch(batch, cfg)
        run = _ActorCriticPass(self.agent, self.actor(), self.critic(), obs, actions)
        B, returns = len(obs), batch.returns.numpy()
        policy_loss = -(advantages * run.log_prob).mean()
        value_loss = np.square(returns - run.value).mean()
        entropy_mean = run.entropy.mean()
        d_value = cfg.vf_coef * 2 * (run.value - returns) / B
        grads = run.gradients(-advantages / B, d_value, cfg.ent_coef)
        group = self.optimizer.param_groups[0]
        params = group["params"]
        coef = _clip_coefficient([grads[p] for p in params], cfg.max_grad_norm)
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        for param in params:
            state = self.optimizer.state[param]
            if not state:  # as torch's RMSprop initializes it
                state["step"] = torch.tensor(0.0)
                state["square_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["step"] += 1
            square_avg, p = state["square_avg"].numpy(), param.detach().numpy()
            grad = grads[param].reshape(p.shape)
            if coef < 1.0:
                grad = grad * np.float32(coef)
            square_avg *= alpha
            square_avg += (1 - alpha) * np.square(grad)
            p -= np.float32(lr) * grad / (np.sqrt(square_avg) + np.float32(eps))
        loss = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
        losses = {"loss": loss, "losses/policy_loss": policy_loss,
                  "losses/value_loss": value_loss, "losses/entropy": entropy_mean}  # fmt: skip
        return {k: torch.tensor(float(v)) for k, v in losses.items()}


def _forward(
    x: np.ndarray, views: list[tuple[np.ndarray, np.ndarray]], tanh: bool = True
) -> tuple[list[np.ndarray], np.ndarray]:
    """An MLP's output and its hidden activations (for _backward)."""
    hidden = []
    for weight, bias in views[:-1]:
        x = x @ weight + bias
        x = np.tanh(x, out=x) if tanh else np.maximum(x, 0.0, out=x)
        hidden.append(x)
    weight, bias = views[-1]
    return hidden, x @ weight + bias


def _backward(x, hidden, views, d_out, path: SequentialRunner, grads: dict, tanh=True) -> None:
    """Gradients of an MLP's weights and biases from d loss / d output, into `grads` keyed
    by the torch parameters (weights as (out, in), as torch holds them)."""
    inputs = [x, *hidden]
    params = path.parameters()
    for layer in range(len(views) - 1, -1, -1):
        weight_t, _ = views[layer]
        torch_weight, torch_bias = params[layer]
        grads[torch_weight] = (inputs[layer].T @ d_out).T
        grads[torch_bias] = d_out.sum(0)
        if layer:
            d_in = d_out @ weight_t.T
            d_out = d_in * (1 - np.square(inputs[layer])) if tanh else d_in * (inputs[layer] > 0)


class FlatAdam:
    """clip_grad_norm_ and then torch Adam's update, for the optimizer's parameters, on flat
    buffers. The parameters and Adam's two moment tensors are re-pointed into three flat
    arrays (as views, so the module, the optimizer and checkpoints keep seeing the same
    values), so that an update is about ten numpy calls, not ten per parameter. When
    load_state_dict has replaced the optimizer's tensors, they are re-pointed again (their
    values copied in)."""

    _of_optimizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer) -> FlatAdam:
        """The FlatAdam of `optimizer` (one per optimizer, kept while it lives)."""
        if optimizer not in cls._of_optimizer:
            cls._of_optimizer[optimizer] = cls(optimizer)
        return cls._of_optimizer[optimizer]

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.params = optimizer.param_groups[0]["params"]
        self._flat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._steps: list[np.ndarray] = []
        self._pointers: list[int] = []

    def _in_place(self) -> bool:
        if self._flat is None:
            return False
        first, last = self.params[0], self.params[-1]
        state = self.optimizer.state
        pointers = [first.data_ptr(), last.data_ptr()]
        for param in (first, last):
            pointers += [state[param]["exp_avg"].data_ptr(), state[param]["exp_avg_sq"].data_ptr()]
        return pointers == self._pointers

    def _repoint(self) -> None:
        total = sum(p.numel() for p in self.params)
        flat = [torch.zeros(total) for _ in range(3)]  # parameters, exp_avg, exp_avg_sq
        offset = 0
        for param in self.params:
            n, state = param.numel(), self.optimizer.state[param]
            views = [buffer[offset : offset + n].view_as(param) for buffer in flat]
            views[0].copy_(param.detach())
            if state:
                views[1].copy_(state["exp_avg"])
                views[2].copy_(state["exp_avg_sq"])
            else:  # as torch's Adam initializes it
                state["step"] = torch.tensor(0.0)
            param.data = views[0]
            state["exp_avg"], state["exp_avg_sq"] = views[1], views[2]
            offset += n
        self._flat = tuple(buffer.numpy() for buffer in flat)
        self._steps = [self.optimizer.state[p]["step"].numpy() for p in self.params]
        first, last, state = self.params[0], self.params[-1], self.optimizer.state
        self._pointers = [first.data_ptr(), last.data_ptr()]
        for param in (first, last):
            self._pointers += [state[param]["exp_avg"].data_ptr(),
                               state[param]["exp_avg_sq"].data_ptr()]  # fmt: skip

    def step(self, grads: dict[torch.Tensor, np.ndarray], max_norm: float | None) -> None:
        if not self._in_place():
            self._repoint()
        params_flat, m, v = self._flat
        g = np.concatenate([grads[p].reshape(-1) for p in self.params])
        coef = _clip_coefficient([g], max_norm)
        if coef < 1.0:
            g *= np.float32(coef)
        for step in self._steps:
            step += 1
        step = float(self._steps[0])
        group = self.optimizer.param_groups[0]
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * np.square(g)
        bias1, bias2 = 1 - beta1**step, 1 - beta2**step
        denom = np.sqrt(v)
        denom /= np.float32(math.sqrt(bias2))
        denom += np.float32(eps)
        params_flat -= np.float32(lr / bias1) * m / denom


def _clip_coefficient(grads: list[np.ndarray], max_norm: float | None) -> float:
    """clip_grad_norm_'s factor: max_norm / (total 2-norm + 1e-6), at most 1 (None: 1)."""
    if max_norm is None:
        return 1.0
    total = np.sqrt(sum(float(np.square(g, dtype=np.float64).sum()) for g in grads))
    return min(max_norm / (total + 1e-6), 1.0)


def plain_in_host_memory(optimizer: torch.optim.Optimizer, kind: type, *off: str) -> bool:
    """`optimizer` is a `kind` with one group, the options `off` (and maximize) unset, over
    float32 parameters in host memory: what the numpy steps reproduce."""
    group = optimizer.param_groups[0] if len(optimizer.param_groups) == 1 else None
    return (
        isinstance(optimizer, kind)
        and group is not None
        and not any(group[option] for option in off)
        and not group.get("maximize", False)
        and all(p.device.type == "cpu" and p.dtype == torch.float32 for p in group["params"])
    )


def adam_in_host_memory(optimizer: torch.optim.Optimizer) -> bool:
    """A plain Adam (no weight decay or amsgrad) in host memory: what FlatAdam reproduces."""
    return plain_in_host_memory(optimizer, torch.optim.Adam, "weight_decay", "amsgrad")


class HostDQNStep:
    """One DQN gradient step in numpy, for a Q-network MLP without a dueling head in host
    memory and a torch Adam: algos/dqn.py's td_loss (Double DQN, MSE or Huber, PER
    weights) with its gradient by hand, then clipping and Adam as HostPPOStep. It takes a
    batch of numpy arrays (ReplayBuffer.sample_host) and returns (loss, TD errors, Q(s, a))
    as td_loss does."""

    def __init__(self, q_network: nn.Module, target_network: nn.Module, optimizer) -> None:
        self.q_path = q_network.advantage_path
        self.online, self.target = HostViews(self.q_path), HostViews(target_network.advantage_path)
        self.adam = FlatAdam.of(optimizer)

    @staticmethod
    def supports(q_network: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        mlp_without_dueling = hasattr(q_network, "advantage_path") and not q_network.dueling
        return mlp_without_dueling and adam_in_host_memory(optimizer)

    def __call__(self, batch: Any, cfg: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        online, target = self.online(), self.target()
        obs = batch.obs.reshape(len(batch.obs), -1).astype(np.float32, copy=False)
        next_obs = batch.next_obs.reshape(len(obs), -1).astype(np.float32, copy=False)
        B, actions = len(obs), batch.actions
        next_q = _forward(next_obs, target, tanh=False)[1]
        if cfg.double_dqn:
            next_action = _forward(next_obs, online, tanh=False)[1].argmax(-1)
            next_value = next_q[_rows(B), next_action]
        else:
            next_value = next_q.max(-1)
        next_value[batch.terminated] = 0.0
        td_target = batch.rewards + batch.discounts * next_value
        hidden, q = _forward(obs, online, tanh=False)
        q_value = q[_rows(B), actions]
        error = q_value - td_target
        if cfg.loss == "huber":  # smooth L1 with beta 1; its gradient is the clipped error
            magnitude = np.abs(error)
            elementwise = np.where(magnitude < 1.0, 0.5 * np.square(error), magnitude - 0.5)
            d_q = np.clip(error, -1.0, 1.0)
        else:
            elementwise, d_q = np.square(error), 2 * error
        weights = batch.weights if cfg.prioritized else None
        if weights is not None:
            elementwise, d_q = weights * elementwise, weights * d_q
        d_out = np.zeros_like(q)
        d_out[_rows(B), actions] = d_q / B
        grads: dict = {}
        _backward(obs, hidden, online, d_out, self.q_path, grads, tanh=False)
        self.adam.step(grads, cfg.max_grad_norm)
        loss = torch.tensor(float(elementwise.mean()))
        return (
            loss,
            torch.from_numpy(error.astype(np.float32, copy=False)),
            torch.from_numpy(q_value),
        )


class OneEnvDQNStep:
    """One step of DQN's loop with one env: act epsilon-greedily, step the env, write the
    transition into the replay buffer, count the episode. It stands for algos/dqn.py's
    epsilon_greedy -> envs.step -> buffer.add -> run.record_step and leaves the vector env,
    the buffer, the episode statistics, the run and numpy's RNG as those calls would (bit
    for bit), with scalar writes where they go through their general, batched checks and
    bookkeeping: with one env, that bookkeeping is most of a step's cost.

    For a LeanSyncVectorEnv of one env and a ReplayBuffer in host memory with flat
    observations and uniform sampling. Returns the env's next observations (a new array,
    as envs.step returns). When the last step was not its own (the first one, or after a
    checkpoint was loaded), it takes the loop's general step instead.
    """

    def __init__(self, envs: LeanSyncVectorEnv, buffer: Any, run: Any, greedy_actions,
                 num_actions: int, sign_rewards: bool) -> None:  # fmt: skip
        self.envs, self.buffer, self.run = envs, buffer, run
        self.greedy_actions, self.num_actions = greedy_actions, num_actions
        self.sign_rewards = sign_rewards
        # After its own last step: what it returned, the buffer's add count, and whether
        # that step ended an episode (envs.autoreset, buffer.last_done and stats.prev_done,
        # which all hold it).
        self._next_obs: np.ndarray | None = None
        self._added, self._done = -1, False

    @staticmethod
    def supports(envs: gym.vector.VectorEnv, buffer: Any) -> bool:
        return (
            type(envs) is LeanSyncVectorEnv
            and envs.num_envs == 1
            and buffer.num_envs == 1
            and buffer.device.type == "cpu"
            and not buffer.frame_stack
            and buffer.tree is None
        )

    def __call__(
        self, obs: np.ndarray, epsilon: float, general: Callable[[float], np.ndarray]
    ) -> np.ndarray:
        """The step from `obs` (the envs' observations); `general(epsilon)` is the loop's
        own step, for when this one does not apply."""
        buffer, run = self.buffer, self.run
        if obs is not self._next_obs or buffer.added != self._added:
            self._next_obs = general(epsilon)
            self._added, self._done = buffer.added, bool(buffer.last_done[0])
            return self._next_obs
        # epsilon_greedy for one env: the same two uniforms from numpy's global RNG
        explore, which = np.random.random(2).tolist()
        if explore < epsilon:
            action = int(which * self.num_actions)
        else:
            action = int(self.greedy_actions(obs)[0])
        # LeanSyncVectorEnv.step (its reward and flag arrays only stage what it returns)
        envs, valid = self.envs, not self._done  # the step after a done is a pseudo-step
        if valid:
            next_one, reward, terminated, truncated, _ = envs.envs[0].step(action)
            reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        else:  # the pseudo-step: reset, reward 0, no flags
            next_one, _ = envs.envs[0].reset()
            reward, terminated, truncated = 0.0, False, False
        done = self._done = terminated or truncated
        envs.observations[0] = next_one
        envs.autoreset[0] = done  # the general calls put new arrays: nothing else holds these
        next_obs = envs.observations.copy()
        # ReplayBuffer.add and Run.record_step, through their one-env doors
        learnt = np.sign(reward) if self.sign_rewards else reward
        buffer.add_one(action, learnt, next_obs, terminated, truncated)
        self._added = buffer.added
        run.count_steps(1)
        episode = run.stats.update_one(reward, done)
        if episode is not None:
            run.record_episodes([episode[0]], [episode[1]])
        self._next_obs = next_obs
        return next_obs


class LeanRollout:
    """The steps of PPO's and A2C's collect loop (algos/_on_policy.py's collect_rollout) for a
    LeanSyncVectorEnv, a RolloutStorage in host memory and an ActorCritic acting in numpy:
    act, step each env, write the storage's rows, count the episodes. It stands for
    act_on_host -> envs.step -> storage.insert -> run.record_step and leaves the vector
    env, the storage, the episode statistics, the run and numpy's RNG as those calls would
    (bit for bit), stepping each env itself and keeping the episode statistics as Python
    numbers; at the end it hands the rollout to the storage (insert_steps), the last step
    to the vector env (record_steps) and the statistics to the run, through their public
    methods. For a few small envs, the general calls' checks and batched bookkeeping cost a
    third of the step.

    With an observation normalizer and a reward scaler (`obs_norm`, `reward_scale`), each
    step's observations and rewards go through them as the loop sends them; without rewards
    learnt by sign or lives (the caller checks those). The env, the storage and the
    statistics each keep whether the last step ended an episode; when they disagree (a
    resume that had to reset the envs, for one), the loop's general step goes first.
    """

    def __init__(self, envs: LeanSyncVectorEnv, storage: Any, act: HostActorCritic, run: Any,
                 obs_norm: Any = None, reward_scale: Any = None) -> None:  # fmt: skip
        self.envs, self.storage, self.act, self.run = envs, storage, act, run
        self.obs_norm, self.reward_scale = obs_norm, reward_scale

    @staticmethod
    def supports(envs: gym.vector.VectorEnv, storage: Any, act: Any) -> bool:
        return (
            type(envs) is LeanSyncVectorEnv
            and storage.on_host
            and not storage.has_lives
            and isinstance(act, HostActorCritic)
            and bool(act.actor())
        )

    def _in_lockstep(self) -> bool:
        """Whether the env, storage and statistics agree on which envs just ended."""
        done = self.envs.autoreset
        return bool(
            (done == self.storage.prev_done.numpy()).all()
            and (done == self.run.stats.prev_done).all()
        )

    def collect(self, general_step: Callable[[], None]) -> None:
        """The rest of the rollout; `general_step()` is the loop's own step."""
        storage, envs, run, act = self.storage, self.envs, self.run, self.act
        obs_norm, reward_scale = self.obs_norm, self.reward_scale
        while storage.step < storage.num_steps and not self._in_lockstep():
            general_step()
        start, T, N = storage.step, storage.num_steps, storage.num_envs
        if start == T:
            return
        # The observations of the rollout's steps, as stored (obs[0]: the current one)
        first = storage.current_obs_on_host
        obs = np.empty((T - start + 1, *first.shape), dtype=first.dtype)
        obs[0] = first
        raw = envs.observations.copy()  # the envs' own observations, when normalized
        space, discrete = envs.single_action_space, envs._discrete
        box = isinstance(space, gym.spaces.Box)  # send the clipped sample, store the raw one
        stats = run.stats
        returns, lengths = stats.returns.tolist(), stats.lengths.tolist()
        ended = envs.autoreset.tolist()  # the last step ended an episode: a pseudo-step next
        env_list = envs.envs
        actor, critic, noise = act.actor(), act.critic(), act.noise(T - start, N)
        # Each step's outputs, handed to the storage once the rollout is complete
        acted, rewards, terminations, truncations = [], [], [], []
        for j in range(T - start):
            action, log_prob, value = act.sample(obs[j], actor, critic, noise[j])
            acted.append((action, log_prob, value))
            env_actions = np.clip(action, space.low, space.high) if box else action
            if discrete:  # Python ints, as LeanSyncVectorEnv.step sends them
                env_actions = env_actions.tolist()
            next_obs = obs[j + 1] if obs_norm is None else raw
            step_rewards, step_terminated, step_truncated = [0.0] * N, [False] * N, [False] * N
            finished = None
            for i, env in enumerate(env_list):
                if ended[i]:  # the pseudo-step: reset, reward 0, no flags
                    next_obs[i], _ = env.reset()
                    ended[i] = False
                    continue
                next_obs[i], reward, terminated, truncated, _ = env.step(env_actions[i])
                reward = step_rewards[i] = float(reward)
                returns[i] += reward
                lengths[i] += 1
                if terminated or truncated:
                    step_terminated[i], step_truncated[i] = bool(terminated), bool(truncated)
                    ended[i] = True
                    finished = [] if finished is None else finished
                    finished.append(i)
            if obs_norm is not None:
                obs[j + 1] = obs_norm(raw, update=True)
            if reward_scale is None:
                rewards.append(step_rewards)
            else:
                flags = np.array(step_terminated), np.array(step_truncated)
                rewards.append(reward_scale(np.array(step_rewards), *flags))
            terminations.append(step_terminated)
            truncations.append(step_truncated)
            run.count_steps(N)
            if finished is not None:
                run.record_episodes([returns[i] for i in finished], [lengths[i] for i in finished])
                for i in finished:
                    returns[i], lengths[i] = 0.0, 0
        # What the general calls leave behind them, through each one's public methods
        actions, log_probs, values = (np.stack(column) for column in zip(*acted, strict=True))
        storage.insert_steps(obs[1:], actions, log_probs, values, np.array(rewards),
                             np.array(terminations), np.array(truncations))  # fmt: skip
        stats.load_state_dict({"returns": np.array(returns), "lengths": np.array(lengths),
                               "prev_done": np.array(ended)})  # fmt: skip
        envs.record_steps(obs[-1] if obs_norm is None else raw, step_rewards, step_terminated,
                          step_truncated)  # fmt: skip


class LeanSyncVectorEnv(gym.vector.VectorEnv):
    """Envs stepped one after the other in this process, NEXT_STEP autoreset, for Box
    observations: the results of Gymnasium's SyncVectorEnv, step for step, written into
    preallocated arrays. Supports `reset(options={"reset_mask": mask})` as Gymnasium does.
    With `infos=False` the step's infos are not gathered (an empty dict): merging them costs
    more than some envs' own step, and rlstore's loops do not read them.
    (Discrete observations are accepted, for rlstore to refuse them with a clear message.)
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], infos: bool = True) -> None:
        self.gather_infos = infos
        first = env_fns[0]()
        if not isinstance(first.observation_space, (gym.spaces.Box, gym.spaces.Discrete)):
            first.close()
            raise TypeError(
                f"LeanSyncVectorEnv needs Box observations, not {first.observation_space}"
            )
        self.envs = [first] + [make() for make in env_fns[1:]]
        self.num_envs = len(self.envs)
        self.metadata = {**first.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.spec, self.render_mode = first.spec, first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        space = self.single_observation_space
        self.observations = np.zeros((self.num_envs, *space.shape), dtype=space.dtype)
        self.rewards = np.zeros(self.num_envs, dtype=np.float64)
        self.terminations = np.zeros(self.num_envs, dtype=bool)
        self.truncations = np.zeros(self.num_envs, dtype=bool)
        self.autoreset = np.zeros(self.num_envs, dtype=bool)  # the next step is a pseudo-step
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [None] * self.num_envs if seed is None else seed
        if isinstance(seeds, int):
            seeds = [seeds + i for i in range(self.num_envs)]
        mask = np.ones(self.num_envs, dtype=bool)
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = np.asarray(options.pop("reset_mask"), dtype=bool)
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            self.observations[i], info = self.envs[i].reset(seed=seeds[i], options=options)
            infos = self._add_info(infos, info, i)
        self.autoreset[mask] = False
        self.terminations[mask] = False
        self.truncations[mask] = False
        return self.observations.copy(), infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        infos: dict[str, Any] = {}
        if self._discrete:  # Python ints: Discrete.contains (each step's assert) is faster
            actions = np.asarray(actions).tolist()
        for i, (action, env) in enumerate(zip(actions, self.envs, strict=True)):
            if self.autoreset[i]:  # the pseudo-step: reset, reward 0, no flags
                self.observations[i], info = env.reset()
                self.rewards[i], self.terminations[i], self.truncations[i] = 0.0, False, False
            else:
                (self.observations[i], self.rewards[i], self.terminations[i],
                 self.truncations[i], info) = env.step(action)  # fmt: skip
            if info and self.gather_infos:
                infos = self._add_info(infos, info, i)
        self.autoreset = self.terminations | self.truncations
        return (
            self.observations.copy(),
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            infos,
        )

    def record_steps(self, observations: np.ndarray, rewards: list[float],
                     terminations: list[bool], truncations: list[bool]) -> None:  # fmt: skip
        """Take the results of the last step made outside step() (LeanRollout steps the envs
        in `self.envs` itself), as step() would have kept them."""
        self.observations[:] = observations
        self.rewards[:], self.terminations[:] = rewards, terminations
        self.truncations[:] = truncations
        self.autoreset = self.terminations | self.truncations

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


def skip_dynamo_import() -> None:
    """Keep torch.optim from importing its compiler stack (torch._dynamo, about 0.9 s at
    start-up) only to switch it off: it wraps Optimizer methods and the functional
    adam/rmsprop in torch._disable_dynamo, which imports torch._dynamo on first use and
    caches the disabled function as `fn.__dynamo_disable`. rlstore never compiles, so this
    sets that cache to the plain function, where the wrappers are the ones expected; a
    torch without them is left alone. (Optimizer.step still imports it: the numpy steps of
    the small MLPs never call step.)"""
    disable = getattr(torch, "_disable_dynamo", None)
    if disable is None or "torch._dynamo" in sys.modules:
        return
    inner_code = disable(lambda: None).__code__
    functional = [importlib.import_module(f"torch.optim.{name}") for name in ("adam", "rmsprop")]
    candidates = [*vars(torch.optim.Optimizer).values(), functional[0].adam, functional[1].rmsprop]
    for wrapper in candidates:
        while callable(wrapper):
            code = getattr(wrapper, "__code__", None)
            if code is not None and (code is inner_code or code.co_name == "maybe_fallback"):
                target = wrapper.__wrapped__
                target.__dynamo_disable = target
            wrapper = getattr(wrapper, "__wrapped__", None)


def flush_denormals(on: bool) -> None:
    """Flush denormal floats (below ~1e-38) to zero in this thread, as TensorFlow does on
    CPU; numpy in the same thread is affected too, hence a Run turns it off when it ends."""
    torch.set_flush_denormal(on)
