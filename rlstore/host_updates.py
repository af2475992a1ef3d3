"""The updates' fast paths: PPO's, A2C's and DQN's gradient steps in numpy for small MLPs
whose parameters and optimizer state lie in host memory. Each computes its algorithm's loss
(algos/ppo.py's ppo_loss, a2c.py's a2c_loss, dqn.py's td_loss) with the gradient written
out by hand (backpropagation through the MLP), clips it as clip_grad_norm_ does, and
applies the optimizer's own arithmetic to the parameters and to the optimizer's state
through numpy views, so that checkpoints and the torch path see the same optimizer. For
these networks a torch step is ~40 calls and an autograd graph; numpy's calls cost a
fraction. float32 throughout: equal to the torch steps to rounding (tests/test_fast.py
compares each algorithm's update with its step and without it)."""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn

from rlstore.action_heads import MASKED_LOGIT
from rlstore.host_networks import (
    LOG_SQRT_2PI,
    HostViews,
    SequentialRunner,
    _rows,
    host_features,
)
from rlstore.parts import to_numpy


class _ActorCriticPass:
    """The forward pass of an ActorCritic's two Tanh MLPs on a minibatch, in numpy (log-probs
    of the taken actions, entropies, values), and the backward pass from the loss's
    derivatives with respect to them: what HostPPOStep and HostA2CStep share."""

    def __init__(
        self,
        agent: nn.Module,
        actor: list,
        critic: list,
        obs,
        actions,
        masks: np.ndarray | None = None,
    ) -> None:
        self.agent, self.actor, self.critic = agent, actor, critic
        self.obs = obs
        self.actor_acts, out = _forward(obs, actor)
        if masks is not None:  # as masked_logits: the masked actions' gradients are then 0
            out = np.where(masks, out, np.float32(MASKED_LOGIT))
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
        _backward(
            self.obs, self.actor_acts, self.actor, d_out.astype(np.float32), agent.actor_path, grads
        )
        _backward(
            self.obs,
            self.critic_acts,
            self.critic,
            d_value.astype(np.float32)[:, None],
            agent.critic_path,
            grads,
        )
        return grads


def _minibatch(batch: Any, cfg: Any, encoder: Any) -> tuple[np.ndarray, ...]:
    """(observations as the encoder's float32 rows, actions, advantages normalized as
    configured, action masks or None)."""
    obs = host_features(to_numpy(batch.obs), encoder)
    advantages = batch.advantages.numpy()
    if cfg.norm_adv and len(obs) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std(ddof=1) + 1e-8)
    masks = None if batch.action_masks is None else batch.action_masks.numpy()
    return obs, batch.actions.numpy(), advantages, masks


def _tie_weights(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """d max(a, b) / d a: 1 where a is larger, 1/2 on a tie (as torch), else 0."""
    return np.where(a > b, 1.0, np.where(a == b, 0.5, 0.0))


def host_actor_critic(agent: nn.Module) -> bool:
    """An ActorCritic acting in numpy (its MLPs in host memory) with no action head: the
    actor-critics whose gradients _ActorCriticPass writes out."""
    return getattr(agent, "act_on_host", None) is not None and agent.head is None


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
        """An ActorCritic in host memory with a Discrete or Box action space (no head: its
        gradients are written for a categorical and a Gaussian) and a plain Adam
        (adam_in_host_memory)."""
        return host_actor_critic(agent) and adam_in_host_memory(optimizer)

    def __call__(self, batch: Any, cfg: Any, diagnostics: bool = True) -> dict[str, torch.Tensor]:
        obs, actions, advantages, masks = _minibatch(batch, cfg, self.agent.encoder)
        outputs = _ActorCriticPass(self.agent, self.actor(), self.critic(), obs, actions, masks)
        B, clip = len(obs), cfg.clip_coef
        old_value, returns = batch.values.numpy(), batch.returns.numpy()
        log_ratio = outputs.log_prob - batch.log_probs.numpy()
        ratio = np.exp(log_ratio)
        unclipped, clipped = -advantages * ratio, -advantages * np.clip(ratio, 1 - clip, 1 + clip)
        policy_loss = np.maximum(unclipped, clipped).mean()
        error = outputs.value - returns
        if cfg.clip_vloss:
            delta = outputs.value - old_value
            clipped_error = old_value + np.clip(delta, -clip, clip) - returns
            value_loss = 0.5 * np.maximum(np.square(error), np.square(clipped_error)).mean()
        else:
            value_loss = 0.5 * np.square(error).mean()
        entropy_mean = outputs.entropy.mean()

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
        grads = outputs.gradients(d_ratio * ratio, d_value, cfg.ent_coef)
        HostAdam.of(self.optimizer).step(grads, cfg.max_grad_norm)

        loss = policy_loss - cfg.ent_coef * entropy_mean + cfg.vf_coef * value_loss
        losses = {
            "losses/policy_loss": policy_loss,
            "losses/value_loss": value_loss,
            "losses/entropy": entropy_mean,
            "loss": loss,
        }
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
        """As HostPPOStep's, with a plain RMSprop (no momentum, not centered)."""
        return host_actor_critic(agent) and plain_in_host_memory(
            optimizer, torch.optim.RMSprop, "weight_decay", "momentum", "centered"
        )

    def __call__(self, batch: Any, cfg: Any) -> dict[str, torch.Tensor]:
        obs, actions, advantages, masks = _minibatch(batch, cfg, self.agent.encoder)
        outputs = _ActorCriticPass(self.agent, self.actor(), self.critic(), obs, actions, masks)
        B, returns = len(obs), batch.returns.numpy()
        policy_loss = -(advantages * outputs.log_prob).mean()
        value_loss = np.square(returns - outputs.value).mean()
        entropy_mean = outputs.entropy.mean()
        d_value = cfg.vf_coef * 2 * (outputs.value - returns) / B
        grads = outputs.gradients(-advantages / B, d_value, cfg.ent_coef)
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
        losses = {
            "loss": loss,
            "losses/policy_loss": policy_loss,
            "losses/value_loss": value_loss,
            "losses/entropy": entropy_mean,
        }
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
        grads[torch_weight] = d_out.T @ inputs[layer]  # (out, in), contiguous for HostAdam
        grads[torch_bias] = d_out.sum(0)
        if layer:
            d_in = _times_transpose(d_out, weight_t)
            d_out = d_in * (1 - np.square(inputs[layer])) if tanh else d_in * (inputs[layer] > 0)


def _times_transpose(d_out: np.ndarray, weight_t: np.ndarray) -> np.ndarray:
    """d_out @ weight_t.T; for a one-column d_out (a value head) an outer product, which
    numpy's BLAS computes several times slower as a matrix product than as a broadcast."""
    if d_out.shape[1] == 1:
        return d_out * weight_t[:, 0]
    return d_out @ weight_t.T


class HostAdam:
    """clip_grad_norm_ and then torch Adam's update, for the optimizer's parameters, on flat
    buffers. The parameters and Adam's two moment tensors are re-pointed into three flat
    arrays (as views, so the module, the optimizer and checkpoints keep seeing the same
    values), so that an update is about ten numpy calls, not ten per parameter. When
    load_state_dict has replaced the optimizer's tensors, they are re-pointed again (their
    values copied in)."""

    _of_optimizer: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, optimizer: torch.optim.Optimizer) -> HostAdam:
        """The HostAdam of `optimizer` (one per optimizer, kept while it lives)."""
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
            with torch.no_grad():  # the parameter's storage becomes the flat buffer's slice
                param.set_(views[0])
            state["exp_avg"], state["exp_avg_sq"] = views[1], views[2]
            offset += n
        self._flat = tuple(buffer.numpy() for buffer in flat)
        self._steps = [self.optimizer.state[p]["step"].numpy() for p in self.params]
        first, last, state = self.params[0], self.params[-1], self.optimizer.state
        self._pointers = [first.data_ptr(), last.data_ptr()]
        for param in (first, last):
            self._pointers += [
                state[param]["exp_avg"].data_ptr(),
                state[param]["exp_avg_sq"].data_ptr(),
            ]

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
    """A plain Adam (no weight decay or amsgrad) in host memory: what HostAdam reproduces."""
    return plain_in_host_memory(optimizer, torch.optim.Adam, "weight_decay", "amsgrad")


def allowed_argmax(q: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """argmax over the last axis among the `allowed` entries (all where None)."""
    return (q if allowed is None else np.where(allowed, q, -np.inf)).argmax(-1)


def no_bootstrap(batch: Any) -> np.ndarray:
    """The transitions whose target takes no next value: terminated ones, and under action
    masks those whose next state allows no action."""
    allowed = batch.next_action_masks
    return batch.terminated if allowed is None else batch.terminated | ~allowed.any(-1)


def host_td_loss(out, next_out, next_online, batch, cfg) -> tuple:
    """algos/dqn.py's td_loss (Double DQN, MSE or Huber) on the Q-network's outputs in
    numpy: Q(s, .) `out`, the target network's Q(s', .) `next_out` and, with Double DQN,
    the online network's `next_online`; with action masks, a' is among the actions the next
    state allows (none allowed: no bootstrap). Returns (per-sample loss, its derivative in
    `out`, TD errors, Q(s, a)), the form HostDQNStep takes a loss in."""
    B, actions = len(out), batch.actions
    chooser = next_out if next_online is None else next_online  # Double DQN: the online net
    next_value = next_out[_rows(B), allowed_argmax(chooser, batch.next_action_masks)]
    next_value[no_bootstrap(batch)] = 0.0
    td_target = batch.rewards + batch.discounts * next_value
    q_value = out[_rows(B), actions]
    error = q_value - td_target
    if cfg.loss == "huber":  # smooth L1 with beta 1; its gradient is the clipped error
        magnitude = np.abs(error)
        elementwise = np.where(magnitude < 1.0, 0.5 * np.square(error), magnitude - 0.5)
        d_q = np.clip(error, -1.0, 1.0)
    else:
        elementwise, d_q = np.square(error), 2 * error
    d_out = np.zeros_like(out)
    d_out[_rows(B), actions] = d_q
    return elementwise, d_out, error.astype(np.float32, copy=False), q_value


class HostDQNStep:
    """One DQN gradient step in numpy, for a Q-network MLP without a dueling head in host
    memory and a torch Adam: a loss on the network's outputs with its gradient by hand
    (`loss`: host_td_loss, algos/dqn.py's td_loss, unless a variant brings its own), PER
    weights, backpropagation through the MLP, then clipping and Adam as HostPPOStep. It
    takes a batch of numpy arrays (ReplayBuffer.sample_host) and returns (loss, priority
    errors, Q(s, a)) as the torch loss does."""

    def __init__(
        self, q_network: nn.Module, target_network: nn.Module, optimizer, loss=host_td_loss
    ) -> None:
        self.q_path, self.encoder = q_network.advantage_path, q_network.encoder
        self.online, self.target = HostViews(self.q_path), HostViews(target_network.advantage_path)
        self.adam = HostAdam.of(optimizer)
        self.loss = loss

    @staticmethod
    def supports(q_network: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        mlp_without_dueling = hasattr(q_network, "advantage_path") and not q_network.dueling
        numpy_encoder = hasattr(getattr(q_network, "encoder", None), "host")
        return mlp_without_dueling and numpy_encoder and adam_in_host_memory(optimizer)

    def __call__(self, batch: Any, cfg: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        online, target = self.online(), self.target()
        obs, next_obs = (
            host_features(batch.obs, self.encoder),
            host_features(batch.next_obs, self.encoder),
        )
        next_out = _forward(next_obs, target, tanh=False)[1]
        next_online = _forward(next_obs, online, tanh=False)[1] if cfg.double_dqn else None
        hidden, out = _forward(obs, online, tanh=False)
        elementwise, d_out, priority_error, q_value = self.loss(
            out, next_out, next_online, batch, cfg
        )
        if cfg.prioritized:
            elementwise, d_out = batch.weights * elementwise, batch.weights[:, None] * d_out
        d_out /= len(obs)
        grads: dict = {}
        _backward(obs, hidden, online, d_out, self.q_path, grads, tanh=False)
        self.adam.step(grads, cfg.max_grad_norm)
        loss = torch.from_numpy(np.asarray(elementwise.mean()))
        return loss, torch.from_numpy(priority_error), torch.from_numpy(q_value)
