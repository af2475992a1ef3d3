"""RolloutStorage: the on-policy buffer of PPO and A2C, correct at episode boundaries.

Layout: preallocated tensors of shape (num_steps, num_envs, ...) on one device, written in
place; `obs` has one extra row so that obs[t + 1] is the observation after step t.

Episode boundaries (docs/reference/episode-boundaries.md) under Gymnasium's NEXT_STEP autoreset:
- the observation returned with a done step is the episode's final observation, so the
  bootstrap value of step t is V'_t = V(obs[t + 1]) = values[t + 1] in every case;
- terminated and truncated are stored apart: a termination bootstraps with 0, a
  truncation from V(final observation);
- the step after a done is a pseudo-step; `insert` marks it invalid, and it is never
  handed out by `minibatches` or `flatten`;
- a lost life (Atari) cuts the bootstrap and the advantage chain as a termination does,
  but the game goes on: the next step is a real one. `life_lost` is stored apart from
  `terminated`, which, with `truncated`, says that the env was reset;
- `episode_starts[t]` says that obs[t] is an episode's first observation (the one the
  pseudo-step returned, or the first after `reset`): a recurrent policy's state is zero
  before it.

Observations made of parts (Dict and Tuple spaces; rlstore/parts.py) are kept part by
part, each in its own dtype: `obs_shape` and `obs_dtype` are then dicts or tuples of
shapes and dtypes, and `obs`, `current_obs` and the batches' `obs` dicts or tuples of
tensors. Every rule above holds for each part.

Action masks (`action_mask_shape`): `action_masks[t]` is the mask of obs[t], written with
it (reset, insert), so that an update recomputes log-probs and entropies under the masks
collection acted with; the batches carry them as `action_masks`.

A recurrent policy (`recurrent_state_shape`) also stores the state each step's action was
taken from, and `sequences` hands out minibatches of whole sequences (time-major, with
the state at each sequence's start), so that the policy replays its recurrence exactly.

On a GPU the per-step writes are asynchronous copies, and the validity flags (which decide
what `minibatches` hands out) live in host memory: neither `insert` nor `minibatches`
waits for the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from rlstore.parts import Tree, check_parts, is_shape, map_parts, map_shapes, take
from rlstore.storage.arrays import (
    Array,
    checked,
    copy_in,
    host_array,
    load_tensors,
    to_device,
    torch_dtype,
)
from rlstore.storage.returns import compute_gae


def _checked_obs(given: Array, name: str, mine: torch.Tensor) -> torch.Tensor:
    """An observation part given for one row of `mine` (a part's storage), checked."""
    return checked(given, name, mine.shape[1:], mine.dtype)


def _host_obs(given: Array, name: str, mine: torch.Tensor) -> np.ndarray:
    return host_array(given, name, mine.shape[1:], mine.dtype)


class RolloutBatch(NamedTuple):
    """A flat minibatch: one row per valid transition."""

    obs: Tree
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    action_masks: torch.Tensor | None = None


class RecurrentBatch(NamedTuple):
    """A minibatch of sequences, time-major: (L, B, ...) for L steps of B sequences.

    `initial_state` (B, *state) is the state the first step of each sequence was taken
    from; before each later step t the state is zeroed where `episode_starts[t]`. `valid`
    marks real transitions (pseudo-steps are False): losses average over those only.
    `valid` and `episode_starts` are host tensors, as the storage keeps its flags: a policy
    on a GPU finds its cuts and indexes its valid steps without reading the device back."""

    obs: Tree
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    valid: torch.Tensor
    episode_starts: torch.Tensor
    initial_state: torch.Tensor
    action_masks: torch.Tensor | None = None


class RolloutStorage:
    """Fixed-size on-policy storage for `num_steps` vector steps of `num_envs` envs.

    Typical loop (see rlstore/algos/ppo.py)::

        storage.reset(first_obs)
        for step in range(num_steps):
            action, log_prob, value = policy(storage.current_obs)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            storage.insert(next_obs, action, log_prob, value, reward, terminated, truncated)
        storage.compute_returns(policy_value(storage.current_obs), gamma=0.99, gae_lambda=0.95)
        for epoch in range(epochs):
            for batch in storage.minibatches(4):
                ...
        storage.after_update()
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...] | Tree,
        action_shape: tuple[int, ...] = (),
        obs_dtype: torch.dtype | np.dtype | type | Tree = torch.float32,
        action_dtype: torch.dtype | np.dtype | type = torch.int64,
        device: torch.device | str = "cpu",
        fast: bool = True,
        recurrent_state_shape: tuple[int, ...] | None = None,
        action_mask_shape: tuple[int, ...] | None = None,
    ) -> None:
        if num_steps < 1 or num_envs < 1:
            raise ValueError(f"num_steps and num_envs must be >= 1, got {num_steps}, {num_envs}")
        self.num_steps, self.num_envs = num_steps, num_envs
        self.obs_shape = tuple(obs_shape) if is_shape(obs_shape) else obs_shape
        self.action_shape = tuple(action_shape)
        self.device = torch.device(device)
        T, N, dev = num_steps, num_envs, self.device
        self.obs = map_shapes(
            lambda shape, dtype: torch.zeros(
                (T + 1, N, *shape), dtype=torch_dtype(dtype), device=dev
            ),
            self.obs_shape,
            obs_dtype,
        )
        self.actions = torch.zeros(
            (T, N, *self.action_shape), dtype=torch_dtype(action_dtype), device=dev
        )
        self.log_probs = torch.zeros((T, N), device=dev)
        self.values = torch.zeros((T, N), device=dev)
        self.rewards = torch.zeros((T, N), device=dev)
        self.terminated = torch.zeros((T, N), dtype=torch.bool, device=dev)
        self.truncated = torch.zeros((T, N), dtype=torch.bool, device=dev)
        self.life_lost = torch.zeros((T, N), dtype=torch.bool, device=dev)
        self._lives = False  # whether life_lost was ever given (else it stays all False)
        self.advantages = torch.zeros((T, N), device=dev)
        self.returns = torch.zeros((T, N), device=dev)
        # Host flags: whether each step is a real transition, and whether the last inserted
        # step ended an episode (the next step is then a pseudo-step).
        self.valid = torch.zeros((T, N), dtype=torch.bool)
        self.prev_done = torch.zeros(N, dtype=torch.bool)
        self.episode_starts = torch.ones((T + 1, N), dtype=torch.bool)  # host, as valid
        self._valid, self._prev_done = self.valid.numpy(), self.prev_done.numpy()
        self._starts = self.episode_starts.numpy()
        # A recurrent policy's state before each step (after zeroing at episode starts).
        self.recurrent_state_shape = recurrent_state_shape
        self.recurrent_states = (
            None
            if recurrent_state_shape is None
            else torch.zeros((T, N, *recurrent_state_shape), device=dev)
        )
        # The mask of each observation's allowed actions, where the env gives them.
        self.action_masks = (
            None
            if action_mask_shape is None
            else torch.ones((T + 1, N, *action_mask_shape), dtype=torch.bool, device=dev)
        )
        # In host memory, insert writes through numpy views (and compute_returns runs in
        # numpy): a numpy assignment costs a fraction of a torch copy_ call, and the step
        # loop makes seven of them. fast=False keeps the torch code everywhere.
        self._views = (
            {name: map_parts(torch.Tensor.numpy, getattr(self, name)) for name in self._INSERTED}
            if self.device.type == "cpu" and fast
            else None
        )
        self.step = 0
        self._returns_ready = False

    _INSERTED = (
        "obs",
        "actions",
        "log_probs",
        "values",
        "rewards",
        "terminated",
        "truncated",
        "life_lost",
    )

    # -- writing ----------------------------------------------------------------------------

    @property
    def current_obs(self) -> Tree:
        """The observation the next action is taken at (a view into the storage)."""
        return take(self.obs, self.step)

    @property
    def current_obs_on_host(self) -> Tree | None:
        """current_obs as a numpy view, when the storage is in host memory (else None)."""
        return None if self._views is None else take(self._views["obs"], self.step)

    @property
    def current_action_mask(self) -> torch.Tensor | None:
        """The action mask of current_obs (None: a storage without masks)."""
        return None if self.action_masks is None else self.action_masks[self.step]

    @property
    def on_host(self) -> bool:
        """Whether insert writes numpy views of host memory (the fast path)."""
        return self._views is not None

    @property
    def current_episode_starts(self) -> np.ndarray:
        """Whether current_obs begins an episode, per env (host flags)."""
        return self._starts[self.step]

    @property
    def has_lives(self) -> bool:
        """Whether a lost life was ever given to insert (Atari)."""
        return self._lives

    def reset(self, obs: Array | None = None, action_mask: Array | None = None) -> None:
        """Forget the rollout and any episode in progress; optionally set the first
        observation (and its action mask, for a storage with masks)."""
        self.step = 0
        self.prev_done.zero_()
        self.valid.zero_()
        self.episode_starts.fill_(True)
        self._returns_ready = False
        if obs is not None:
            obs = check_parts(_checked_obs, obs, self.obs, "obs")
            mask = self._checked_mask(action_mask)
            map_parts(lambda mine, given: copy_in(mine[0], given), self.obs, obs)
            if mask is not None:
                copy_in(self.action_masks[0], mask)

    def _checked_mask(self, action_mask: Array | None) -> torch.Tensor | None:
        """A step's action mask, checked; given exactly when the storage keeps masks."""
        if (action_mask is None) != (self.action_masks is None):
            raise ValueError(
                "action_mask must be given exactly when the storage was made with action_mask_shape"
            )
        if action_mask is None:
            return None
        return checked(action_mask, "action_mask", self.action_masks.shape[1:], torch.bool)

    def insert(
        self,
        next_obs: Array,
        action: Array,
        log_prob: Array,
        value: Array,
        reward: Array,
        terminated: Array,
        truncated: Array,
        life_lost: Array | None = None,
        recurrent_state: Array | None = None,
        action_mask: Array | None = None,
    ) -> None:
        """Record one vector step taken at `current_obs`; `next_obs` is what the env returned.
        `life_lost` (Atari): a life ended without the game ending. `recurrent_state`: the
        state the action was taken from (a storage made with recurrent_state_shape needs
        it). `action_mask`: next_obs's (a storage made with action_mask_shape needs it)."""
        t = self.step
        if t >= self.num_steps:
            raise IndexError(
                f"RolloutStorage is full ({self.num_steps} steps); call after_update() "
                "before inserting the next rollout"
            )
        N = self.num_envs
        if (recurrent_state is None) != (self.recurrent_states is None):
            raise ValueError(
                "recurrent_state must be given exactly when the storage was made with "
                "recurrent_state_shape"
            )
        # Check everything before writing anything: a bad input leaves the storage as it was.
        mask = self._checked_mask(action_mask)
        state = None
        if recurrent_state is not None:
            state = checked(
                recurrent_state, "recurrent_state", self.recurrent_states.shape[1:], torch.float32
            )
        if self._views is not None:
            self._insert_on_host(
                t,
                next_obs,
                action,
                log_prob,
                value,
                reward,
                terminated,
                truncated,
                life_lost,
                state,
                mask,
            )
            return
        next_obs = check_parts(_checked_obs, next_obs, self.obs, "next_obs")
        fields = (
            (
                self.actions[t],
                checked(action, "action", self.actions.shape[1:], self.actions.dtype),
            ),
            (self.log_probs[t], checked(log_prob, "log_prob", (N,), torch.float32)),
            (self.values[t], checked(value, "value", (N,), torch.float32)),
            (self.rewards[t], checked(reward, "reward", (N,), torch.float32)),
        )
        term = host_array(terminated, "terminated", (N,), torch.bool)
        trunc = host_array(truncated, "truncated", (N,), torch.bool)
        lives = None if life_lost is None else host_array(life_lost, "life_lost", (N,), torch.bool)
        self._write_state_and_mask(t, state, mask)
        map_parts(lambda mine, given: copy_in(mine[t + 1], given), self.obs, next_obs)
        for destination, source in fields:
            copy_in(destination, source)
        copy_in(self.terminated[t], torch.from_numpy(term))
        copy_in(self.truncated[t], torch.from_numpy(trunc))
        if lives is not None:
            copy_in(self.life_lost[t], torch.from_numpy(lives))
            self._lives = True
        elif self._lives:
            self.life_lost[t].zero_()
        np.logical_not(self._prev_done, out=self._valid[t])
        self._starts[t + 1] = self._prev_done  # a pseudo-step returns a first observation
        np.logical_or(term, trunc, out=self._prev_done)
        self.step = t + 1
        self._returns_ready = False

    def _write_state_and_mask(
        self, t: int, state: torch.Tensor | None, mask: torch.Tensor | None
    ) -> None:
        """insert()'s recurrent state (taken at step t) and mask (of next_obs), checked."""
        if state is not None:
            copy_in(self.recurrent_states[t], state)
        if mask is not None:
            copy_in(self.action_masks[t + 1], mask)

    def _insert_on_host(
        self,
        t,
        next_obs,
        action,
        log_prob,
        value,
        reward,
        terminated,
        truncated,
        life_lost,
        state,
        mask,
    ) -> None:
        """insert() for storage in host memory: the same checks, then numpy writes."""
        N, views = self.num_envs, self._views
        next_obs = check_parts(_host_obs, next_obs, self.obs, "next_obs")
        arrays = (
            (
                "actions",
                t,
                host_array(action, "action", self.actions.shape[1:], self.actions.dtype),
            ),
            ("log_probs", t, host_array(log_prob, "log_prob", (N,), torch.float32)),
            ("values", t, host_array(value, "value", (N,), torch.float32)),
            ("rewards", t, host_array(reward, "reward", (N,), torch.float32)),
        )
        term = host_array(terminated, "terminated", (N,), torch.bool)
        trunc = host_array(truncated, "truncated", (N,), torch.bool)
        lives = None if life_lost is None else host_array(life_lost, "life_lost", (N,), torch.bool)
        self._write_state_and_mask(t, state, mask)
        if type(next_obs) is np.ndarray:  # one part (the usual case): no tree walk
            views["obs"][t + 1] = next_obs
        else:
            map_parts(lambda view, given: view.__setitem__(t + 1, given), views["obs"], next_obs)
        for name, row, array in arrays:
            views[name][row] = array
        views["terminated"][t] = term
        views["truncated"][t] = trunc
        if lives is not None:
            views["life_lost"][t] = lives
            self._lives = True
        elif self._lives:
            views["life_lost"][t] = False
        np.logical_not(self._prev_done, out=self._valid[t])
        self._starts[t + 1] = self._prev_done
        np.logical_or(term, trunc, out=self._prev_done)
        self.step = t + 1
        self._returns_ready = False

    def insert_steps(
        self,
        next_obs: Array,
        actions: Array,
        log_probs: Array,
        values: Array,
        rewards: Array,
        terminated: Array,
        truncated: Array,
    ) -> None:
        """k vector steps at once, from current_obs on (each argument has a leading axis of
        k): the same as k calls of insert without life_lost, with one write per field."""
        t, k, N = self.step, len(terminated), self.num_envs
        if self.recurrent_states is not None or self.action_masks is not None:
            raise ValueError("insert_steps takes no recurrent states or masks; use insert")
        if k == 0:
            return
        if t + k > self.num_steps:
            raise IndexError(
                f"RolloutStorage has room for {self.num_steps - t} more steps, not {k}; call "
                "after_update() before inserting the next rollout"
            )
        next_obs = check_parts(
            lambda given, name, mine: host_array(given, name, (k, *mine.shape[1:]), mine.dtype),
            next_obs,
            self.obs,
            "next_obs",
        )
        fields = (
            ("actions", t, actions, (k, *self.actions.shape[1:]), self.actions.dtype),
            ("log_probs", t, log_probs, (k, N), torch.float32),
            ("values", t, values, (k, N), torch.float32),
            ("rewards", t, rewards, (k, N), torch.float32),
        )
        # Check everything before writing anything: a bad input leaves the storage as it was.
        arrays = [
            (name, row, host_array(x, name, shape, dtype)) for name, row, x, shape, dtype in fields
        ]
        term = host_array(terminated, "terminated", (k, N), torch.bool)
        trunc = host_array(truncated, "truncated", (k, N), torch.bool)
        arrays += [("terminated", t, term), ("truncated", t, trunc)]

        def write(mine: torch.Tensor, view: np.ndarray | None, array: np.ndarray, row: int) -> None:
            if view is not None:
                view[row : row + k] = array
            else:
                copy_in(mine[row : row + k], torch.from_numpy(array))

        views = self._views or dict.fromkeys(("obs", *self._INSERTED))
        if views["obs"] is None:
            map_parts(lambda mine, array: write(mine, None, array, t + 1), self.obs, next_obs)
        else:
            map_parts(
                lambda mine, view, array: write(mine, view, array, t + 1),
                self.obs,
                views["obs"],
                next_obs,
            )
        for name, row, array in arrays:
            write(getattr(self, name), views[name], array, row)
        if self._lives:
            self.life_lost[t : t + k] = False
        done = term | trunc
        np.logical_not(self._prev_done, out=self._valid[t])
        np.logical_not(done[:-1], out=self._valid[t + 1 : t + k])
        np.logical_not(self._valid[t : t + k], out=self._starts[t + 1 : t + k + 1])
        self._prev_done[:] = done[-1]
        self.step = t + k
        self._returns_ready = False

    # -- returns ----------------------------------------------------------------------------

    def compute_returns(
        self, next_value: Array, gamma: float, gae_lambda: float, use_gae: bool = True
    ) -> None:
        """Fill `advantages` and `returns`; `next_value` is V(current_obs) after the last step.

        With use_gae=False the returns are discounted reward sums bootstrapped at the
        rollout end and at truncations (GAE with lambda = 1), and advantages = returns - V.
        """
        if self.step != self.num_steps:
            raise RuntimeError(
                f"compute_returns needs a full rollout; {self.step}/{self.num_steps} steps inserted"
            )
        next_value = checked(next_value, "next_value", (self.num_envs,), torch.float32)
        lam = gae_lambda if use_gae else 1.0
        if self._views is not None:  # host memory: the same arithmetic in numpy
            v = self._views
            next_values = np.concatenate((v["values"][1:], next_value.float().numpy()[None]))
            cut = v["terminated"] | v["life_lost"] if self._lives else v["terminated"]
            advantages = compute_gae(
                v["rewards"], v["values"], next_values, cut, v["truncated"], gamma, lam
            )
            self.advantages = torch.from_numpy(advantages)
            self.returns = torch.from_numpy(advantages + v["values"])
            self._returns_ready = True
            return
        next_values = torch.cat((self.values[1:], to_device(next_value, self.device).float()[None]))
        cut = self.terminated | self.life_lost if self._lives else self.terminated
        self.advantages = compute_gae(
            self.rewards, self.values, next_values, cut, self.truncated, gamma, lam
        )
        self.returns = self.advantages + self.values
        self._returns_ready = True

    # -- reading ----------------------------------------------------------------------------

    def flatten(self) -> dict[str, torch.Tensor]:
        """The valid transitions of the rollout as flat tensors (pseudo-steps left out)."""
        # their indices from the host flags: a mask on the device would be read back
        keep = np.flatnonzero(self._valid[: self.step])
        keep = to_device(torch.from_numpy(keep), self.device)

        def flat(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(-1, *x.shape[2:])[keep]

        fields = {
            "actions": self.actions[: self.step],
            "log_probs": self.log_probs[: self.step],
            "values": self.values[: self.step],
            "rewards": self.rewards[: self.step],
            "terminated": self.terminated[: self.step],
            "truncated": self.truncated[: self.step],
            "life_lost": self.life_lost[: self.step],
        }
        if self.action_masks is not None:
            fields["action_masks"] = self.action_masks[: self.step]
        if self._returns_ready:
            fields["advantages"] = self.advantages
            fields["returns"] = self.returns
        step = self.step
        obs = {"obs": map_parts(lambda x: flat(x[:step]), self.obs)}
        return obs | {k: flat(v) for k, v in fields.items()}

    def minibatches(
        self, num_minibatches: int, generator: torch.Generator | None = None
    ) -> Iterator[RolloutBatch]:
        """One epoch: every valid transition exactly once, in a fresh random order.

        `generator`, if given, is a CPU torch.Generator (the shuffle is drawn on the host).
        """
        if not self._returns_ready:
            raise RuntimeError("call compute_returns() before minibatches()")
        T, N = self.num_steps, self.num_envs
        valid_index = np.flatnonzero(self._valid)  # host flags: no device read
        if num_minibatches < 1 or num_minibatches > max(len(valid_index), 1):
            raise ValueError(
                f"num_minibatches must lie in [1, {len(valid_index)}], got {num_minibatches}"
            )
        order = torch.from_numpy(valid_index)[torch.randperm(len(valid_index), generator=generator)]
        order = to_device(order, self.device)
        obs = map_parts(lambda x: x[:T].reshape(-1, *x.shape[2:]), self.obs)
        flat = (
            self.actions.reshape(-1, *self.action_shape),
            self.log_probs.reshape(-1),
            self.values.reshape(-1),
            self.advantages.reshape(-1),
            self.returns.reshape(-1),
        )
        masks = None if self.action_masks is None else self.action_masks[:T].reshape(T * N, -1)
        for index in order.tensor_split(num_minibatches):
            yield RolloutBatch(
                take(obs, index), *(x[index] for x in flat), None if masks is None else masks[index]
            )

    def sequences(
        self,
        num_minibatches: int,
        sequence_length: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[RecurrentBatch]:
        """One epoch of a recurrent policy's minibatches: each env's rollout cut into
        sequences of `sequence_length` steps (default: the whole rollout, CleanRL's way),
        every sequence exactly once, in a fresh random order, `num_minibatches` groups of
        them. Each sequence starts from the state stored at its first step. Pseudo-steps
        are in the sequences (the recurrence steps through them), marked not `valid`."""
        if self.recurrent_states is None:
            raise RuntimeError("sequences() needs a storage made with recurrent_state_shape")
        if not self._returns_ready:
            raise RuntimeError("call compute_returns() before sequences()")
        T, N = self.num_steps, self.num_envs
        L = T if sequence_length is None else sequence_length
        if L < 1 or T % L:
            raise ValueError(f"sequence_length must divide num_steps ({T}), got {L}")
        count = N * (T // L)  # sequences, numbered (chunk, env)
        if num_minibatches < 1 or num_minibatches > count:
            raise ValueError(f"num_minibatches must lie in [1, {count}], got {num_minibatches}")

        def chunked(x: torch.Tensor) -> torch.Tensor:  # (T, N, ...) -> (L, count, ...)
            return (
                x[:T]
                .reshape(T // L, L, N, *x.shape[2:])
                .transpose(0, 1)
                .reshape(L, count, *x.shape[2:])
            )

        obs = map_parts(chunked, self.obs)
        masks = None if self.action_masks is None else chunked(self.action_masks)
        fields = [
            chunked(x)
            for x in (self.actions, self.log_probs, self.values, self.advantages, self.returns)
        ]
        flags = [chunked(x) for x in (self.valid, self.episode_starts)]  # (host tensors)
        starts = self.recurrent_states[::L].reshape(count, *self.recurrent_state_shape)
        for host_index in torch.randperm(count, generator=generator).tensor_split(num_minibatches):
            index = to_device(host_index, self.device)
            yield RecurrentBatch(
                take(obs, (slice(None), index)),
                *(x[:, index] for x in fields),
                *(x[:, host_index] for x in flags),
                starts[index],
                None if masks is None else masks[:, index],
            )

    def after_update(self) -> None:
        """Start the next rollout from the last observation; episodes in progress carry on."""
        step = self.step
        map_parts(lambda obs: obs[0].copy_(obs[step]), self.obs)
        if self.action_masks is not None:
            self.action_masks[0].copy_(self.action_masks[step])
        self._starts[0] = self._starts[self.step]
        self.step = 0
        self._returns_ready = False

    # -- persistence ------------------------------------------------------------------------

    _TENSORS = (
        "obs",
        "actions",
        "log_probs",
        "values",
        "rewards",
        "terminated",
        "truncated",
        "life_lost",
        "valid",
        "advantages",
        "returns",
        "prev_done",
        "episode_starts",
    )

    def _tensors(self) -> tuple[str, ...]:
        optional = ("recurrent_states", "action_masks")
        return self._TENSORS + tuple(n for n in optional if getattr(self, n) is not None)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            name: map_parts(torch.Tensor.clone, getattr(self, name)) for name in self._tensors()
        }
        state["step"] = self.step
        state["returns_ready"] = self._returns_ready
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # saved before lives; before episode starts (read by recurrent policies only)
        state = {
            "life_lost": torch.zeros_like(self.life_lost),
            "episode_starts": torch.ones_like(self.episode_starts),
            **state,
        }
        load_tensors(self, self._tensors(), state)
        self._lives = bool(self.life_lost.any())
        self.step = int(state["step"])
        self._returns_ready = bool(state["returns_ready"])
