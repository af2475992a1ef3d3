"""RolloutStorage: the on-policy buffer of PPO, A2C and PQN, correct at episode boundaries.

Layout: preallocated tensors of shape (num_steps, num_envs, ...) on one device, written in
place; `obs` has one extra row so that obs[t + 1] is the observation after step t. In host
memory every write goes through numpy views (a numpy assignment costs a fraction of a torch
call), and the returns are computed in numpy; on a GPU the writes are asynchronous copies
and the validity flags live in host memory: neither `insert` nor `minibatches` waits for
the device.

Episode boundaries (docs/reference/episode-boundaries.md) under Gymnasium's NEXT_STEP autoreset:
- the observation returned with a done step is the episode's final observation, so the
  bootstrap value of step t is V'_t = V(obs[t + 1]) = values[t + 1] in every case;
- terminated and truncated are stored apart: a termination bootstraps with 0, a
  truncation from V(final observation);
- the step after a done is a pseudo-step, marked invalid, never handed out by
  `minibatches` or `flatten`;
- a lost life (Atari) cuts the bootstrap and the advantage chain as a termination does,
  but the game goes on: the next step is a real one. `life_lost` is stored apart from
  `terminated`, which, with `truncated`, says that the env was reset;
- `episode_starts[t]` says that obs[t] is an episode's first observation (the one the
  pseudo-step returned, or the first after `reset`): a recurrent policy's state is zero
  before it.

Observations made of parts (Dict and Tuple spaces; rlstore/parts.py) are kept part by
part, each in its own dtype; every rule above holds for each part. Action masks
(`action_mask_shape`): `action_masks[t]` is the mask of obs[t], written with it, so that an
update recomputes log-probs and entropies under the masks collection acted with.
Recurrent policies keep their states too: storage/recurrent.py.
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
from rlstore.storage.migrations import ROLLOUT_FORMAT, rollout_state
from rlstore.storage.returns import compute_gae


class RolloutBatch(NamedTuple):
    """A flat minibatch: one row per valid transition."""

    obs: Tree
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
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

    recurrent_states: torch.Tensor | None = None  # (storage/recurrent.py)

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...] | Tree,
        action_shape: tuple[int, ...] = (),
        obs_dtype: torch.dtype | np.dtype | type | Tree = torch.float32,
        action_dtype: torch.dtype | np.dtype | type = torch.int64,
        device: torch.device | str = "cpu",
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
        # The mask of each observation's allowed actions, where the env gives them.
        self.action_masks = (
            None
            if action_mask_shape is None
            else torch.ones((T + 1, N, *action_mask_shape), dtype=torch.bool, device=dev)
        )
        # What insert writes to: in host memory numpy views of the fields (assigned), on a
        # device the tensors (copied into); each field's row shape and dtype, for the checks.
        self._views: dict[str, Any] | None = None
        self._check, self._write = checked, self._copy
        if self.device.type == "cpu":
            self._views = {}
            self._check, self._write = host_array, self._assign
        self._targets: dict[str, Any] = {}
        self._rows_of: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        for name in ("obs", "terminated", "truncated", "life_lost", *self._FIELDS):
            self._add_target(name)
        self.step = 0
        self._returns_ready = False

    def _add_target(self, name: str) -> None:
        """Make field `name` (when the storage keeps it) one that insert writes."""
        field = getattr(self, name)
        if field is None:
            return
        if self._views is not None:
            self._views[name] = map_parts(torch.Tensor.numpy, field)
        self._targets[name] = field if self._views is None else self._views[name]
        if name != "obs":
            self._rows_of[name] = (tuple(field.shape[1:]), field.dtype)

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
        """Whether the storage is in host memory (written through numpy views)."""
        return self._views is not None

    @property
    def current_episode_starts(self) -> np.ndarray:
        """Whether current_obs begins an episode, per env (host flags)."""
        return self._starts[self.step]

    @property
    def has_lives(self) -> bool:
        """Whether a lost life was ever given to insert (Atari)."""
        return self._lives

    # -- writing ----------------------------------------------------------------------------

    def reset(self, obs: Array | None = None, action_mask: Array | None = None) -> None:
        """Forget the rollout and any episode in progress; optionally set the first
        observation (and its action mask, for a storage with masks)."""
        if obs is not None:
            self._check_mask(action_mask)
            obs = check_parts(self._checker(()), obs, self.obs, "obs")
            mask = self._given(action_mask, "action_mask", self.action_masks, ())
        self.step = 0
        self.prev_done.zero_()
        self.valid.zero_()
        self.episode_starts.fill_(True)
        self._returns_ready = False
        if obs is not None:
            first, write = slice(0, 1), self._write
            map_parts(lambda target, x: write(target, first, x), self._targets["obs"], obs)
            if mask is not None:
                write(self._targets["action_masks"], first, mask)

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
        state the action was taken from (a recurrent storage needs it). `action_mask`:
        next_obs's (a storage made with action_mask_shape needs it)."""
        if self.step >= self.num_steps:
            raise IndexError(
                f"RolloutStorage is full ({self.num_steps} steps); call after_update() "
                "before inserting the next rollout"
            )
        given = (action, log_prob, value, reward, recurrent_state, action_mask)
        self._insert((), self._ONE, next_obs, given, terminated, truncated, life_lost)

    def insert_steps(
        self,
        next_obs: Array,
        actions: Array,
        log_probs: Array,
        values: Array,
        rewards: Array,
        terminated: Array,
        truncated: Array,
        life_lost: Array | None = None,
        recurrent_states: Array | None = None,
        action_masks: Array | None = None,
    ) -> None:
        """k vector steps at once, from current_obs on: the same as k calls of insert, each
        argument with a leading axis of k (`action_masks`: the next observations')."""
        k = len(terminated)
        if self.step + k > self.num_steps:
            raise IndexError(
                f"RolloutStorage has room for {self.num_steps - self.step} more steps, not {k}; "
                "call after_update() before inserting the next rollout"
            )
        given = (actions, log_probs, values, rewards, recurrent_states, action_masks)
        self._insert((k,), self._FIELDS, next_obs, given, terminated, truncated, life_lost)

    # the fields insert_steps writes at step t (the masks at t + 1), and insert's names of them
    _FIELDS = ("actions", "log_probs", "values", "rewards", "recurrent_states", "action_masks")
    _ONE = ("action", "log_prob", "value", "reward", "recurrent_state", "action_mask")

    def _insert(self, lead, names, next_obs, given, terminated, truncated, life_lost) -> None:
        """The one write path: a block of steps (`lead`: () for one step, (k,) for k), every
        input checked before anything is written (a bad input leaves the storage as it was)."""
        t, N = self.step, self.num_envs
        k = lead[0] if lead else 1
        self._check_mask(given[5])
        if (given[4] is None) != (self.recurrent_states is None):
            raise ValueError(
                "recurrent_state must be given exactly when the storage keeps recurrent states "
                "(RecurrentRolloutStorage)"
            )
        next_obs = check_parts(self._checker(lead), next_obs, self.obs, "next_obs")
        check, arrays = self._check, []
        for x, name, field in zip(given, names, self._FIELDS, strict=False):
            if x is not None:
                shape, dtype = self._rows_of[field]
                arrays.append((field, check(x, name, (*lead, *shape) if lead else shape, dtype)))
        term = host_array(terminated, "terminated", (*lead, N), torch.bool)
        trunc = host_array(truncated, "truncated", (*lead, N), torch.bool)
        if life_lost is not None:
            arrays.append(("life_lost", host_array(life_lost, "life_lost", term.shape, torch.bool)))
            self._lives = True
        elif self._lives:  # (once a life was lost, every step says whether one was)
            arrays.append(("life_lost", np.zeros(term.shape, dtype=bool)))
        if k == 0:
            return
        here, after = slice(t, t + k), slice(t + 1, t + k + 1)
        write, targets = self._write, self._targets
        if type(next_obs) is np.ndarray:  # (one part: no tree to walk)
            write(targets["obs"], after, next_obs)
        else:
            map_parts(lambda target, x: write(target, after, x), targets["obs"], next_obs)
        for field, array in arrays:
            write(targets[field], after if field == "action_masks" else here, array)
        write(targets["terminated"], here, term)
        write(targets["truncated"], here, trunc)
        # The step after a done is a pseudo-step, and it returns an episode's first obs.
        np.logical_not(self._prev_done, out=self._valid[t])
        if k == 1:
            self._starts[t + 1] = self._prev_done
            np.logical_or(term, trunc, out=self._prev_done.reshape(term.shape))
        else:
            done = term | trunc
            np.logical_not(done[:-1], out=self._valid[t + 1 : t + k])
            np.logical_not(self._valid[here], out=self._starts[after])
            self._prev_done[:] = done[-1]
        self.step = t + k
        self._returns_ready = False

    def _check_mask(self, action_mask: Array | None) -> None:
        if (action_mask is None) != (self.action_masks is None):
            raise ValueError(
                "action_mask must be given exactly when the storage was made with action_mask_shape"
            )

    def _checker(self, lead: tuple[int, ...]):
        """check_parts' check of an observation part (`lead`: the block's leading shape)."""

        def check(given: Array, name: str, mine: torch.Tensor) -> Array:
            return self._given(given, name, mine, lead)

        return check

    def _given(
        self, x: Array | None, name: str, mine: torch.Tensor | None, lead: tuple[int, ...]
    ) -> Array | None:
        """A block of `mine`'s rows given as `name`, checked: a numpy array for storage in
        host memory, a tensor (left on its device) for storage on a device."""
        if x is None:
            return None
        return self._check(x, name, (*lead, *mine.shape[1:]), mine.dtype)

    @staticmethod
    def _assign(view: np.ndarray, rows: slice, x: np.ndarray) -> None:
        view[rows] = x

    @staticmethod
    def _copy(tensor: torch.Tensor, rows: slice, x: Array) -> None:
        copy_in(tensor[rows], x if isinstance(x, torch.Tensor) else torch.from_numpy(x))

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
        state["format_version"] = ROLLOUT_FORMAT
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() (of this format or an older one: storage/migrations.py)."""
        state = rollout_state(state)
        load_tensors(self, self._tensors(), state)
        self._lives = bool(self.life_lost.any())
        self.step = int(state["step"])
        self._returns_ready = bool(state["returns_ready"])
