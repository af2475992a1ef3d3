"""The fast paths: what makes rlstore fast, each behind a small name, each with an
equivalence test in tests/test_fast.py; docs/fast-paths.md says what each buys.

The networks, storage and algorithms read as the reference math and call these:

- SequentialRunner: the layers of an MLP called as plain F.linear / activation calls,
  without nn.Module's per-call dispatch (which costs more than these small products);
- sample_categorical, sample_gaussian: actions and their log-probabilities by direct
  formulas instead of torch.distributions objects;
- GreedyActor: DQN's argmax Q for host observations, in numpy when the network is on
  the CPU (one tiny forward per env step, where torch's dispatch costs most);
- HostActorCritic: PPO's and A2C's act() likewise, with sampling from numpy's RNG;
- LeanSyncVectorEnv: envs stepped in turn into preallocated arrays (Gymnasium's generic
  SyncVectorEnv spends more per step on space dispatch and copies than CartPole itself);
- flush_denormals: DQN's Adam moments of dead ReLU units decay into denormal floats,
  where CPU arithmetic is several times slower.

Each does the same arithmetic, in the same order, as the plain version it replaces,
except HostActorCritic: numpy's float32 kernels and RNG instead of torch's.
"""

from __future__ import annotations

import math
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

    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        actor, critic = self.actor(), self.critic()
        if not actor or not critic:
            return None
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        out = numpy_mlp(x, actor, tanh=True)
        value = numpy_mlp(x, critic, tanh=True)[:, 0]
        if self.log_std is None:  # inverse CDF of the softmax, as sample_categorical
            shifted = out - out.max(-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            u = np.random.random((len(x), 1)).astype(np.float32)
            action = (np.exp(log_probs).cumsum(-1) < u).sum(-1)
            np.minimum(action, out.shape[-1] - 1, out=action)  # u above a rounded-down total
            log_prob = np.take_along_axis(log_probs, action[:, None], -1)[:, 0]
            return action, log_prob, value
        log_std = self.log_std.detach().numpy()
        noise = np.random.standard_normal(out.shape).astype(np.float32)
        action = out + np.exp(log_std) * noise
        log_prob = (-0.5 * np.square(noise) - log_std - np.float32(LOG_SQRT_2PI)).sum(-1)
        return action, log_prob.astype(np.float32), value


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

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


def flush_denormals(on: bool) -> None:
    """Flush denormal floats (below ~1e-38) to zero in this thread, as TensorFlow does on
    CPU; numpy in the same thread is affected too, hence a Run turns it off when it ends."""
    torch.set_flush_denormal(on)
