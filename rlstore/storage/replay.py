"""ReplayBuffer: the off-policy buffer of DQN, with n-step returns and prioritized replay.

Layout: a ring of `rows` vector steps, each row holding one transition per env, in
preallocated tensors on one device. Each observation is stored once: the next observation
of row i is the observation of row i + 1 (same env). This is exact under Gymnasium's
NEXT_STEP autoreset, where the stream of observations of one env is
    o_0, o_1, ..., o_final, o_reset, o'_1, ...
The step taken at o_final is a pseudo-step (action ignored, reward 0, next obs o_reset): it
gets a row, marked invalid and never sampled, whose observation slot holds o_final, the
true final observation that a truncated transition bootstraps from. `add` checks that each
call continues the stream (its obs is the previous call's next_obs).

The row at the write cursor holds the newest next_obs and no transition, so a buffer of
capacity C per env keeps C + 1 rows. n-step windows stop at the first done, at the newest
row, and never read across the cursor.

Prioritized replay (proportional, Schaul et al. 2016): a sum tree over all (row, env)
slots holds priority^alpha; invalid slots hold 0. New transitions get the maximum priority
seen so far; importance weights (N * P(i))^-beta are divided by the batch maximum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from rlstore.checkpoint import atomic_save, safe_load
from rlstore.storage.rollout import Array, _torch_dtype, checked, load_tensors


class ReplayBatch(NamedTuple):
    """A sampled batch. The target is rewards + discounts * (1 - terminated) * V(next_obs).

    rewards: the n-step discounted reward sums; discounts: gamma^k with the real window
    length k; terminated: whether the window ended with a termination. weights are the
    importance weights (ones without prioritized replay); indices go to update_priorities.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor
    discounts: torch.Tensor
    weights: torch.Tensor
    indices: torch.Tensor


class SumTree:
    """A binary sum tree over `size` leaves (float64 numpy), with vectorized update and search."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.capacity = 1 << max(size - 1, 0).bit_length()  # leaves, a power of two
        self.nodes = np.zeros(2 * self.capacity, dtype=np.float64)  # root at 1

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    @property
    def leaves(self) -> np.ndarray:
        return self.nodes[self.capacity : self.capacity + self.size]

    def update(self, index: np.ndarray, value: np.ndarray) -> None:
        """Set leaves `index` to `value` (the last write wins for repeated indices)."""
        node = np.asarray(index, dtype=np.int64) + self.capacity
        self.nodes[node] = value
        node = np.unique(node >> 1)
        while node[0] >= 1:  # all leaves sit at one depth, so each level is one step up
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]
            node = np.unique(node >> 1)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each prefix mass in [0, total), the leaf whose cumulative range contains it."""
        node = np.ones(len(mass), dtype=np.int64)
        mass = np.array(mass, dtype=np.float64)
        while node[0] < self.capacity:
            left = self.nodes[2 * node]
            right = mass >= left
            mass -= left * right
            node = 2 * node + right
        # Rounding can land on an empty leaf at the right edge: step back to a non-empty one.
        leaf = np.minimum(node - self.capacity, self.size - 1)
        empty = self.nodes[leaf + self.capacity] <= 0
        if empty.any():
            nonzero = np.flatnonzero(self.leaves > 0)
            pos = np.searchsorted(nonzero, leaf[empty]).clip(0, len(nonzero) - 1)
            leaf[empty] = nonzero[pos]
        return leaf


class ReplayBuffer:
    """Circular replay storage for `num_envs` envs, one `add` per vector step.

    Typical loop (see rlstore/algos/dqn.py)::

        obs, _ = envs.reset(seed=1)
        for step in range(steps):
            action = ...
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            buffer.add(obs, action, reward, next_obs, terminated, truncated)
            obs = next_obs
            if buffer.ready(128):
                batch = buffer.sample(128)
    """

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        obs_dtype: torch.dtype | np.dtype | type = torch.float32,
        action_shape: tuple[int, ...] = (),
        action_dtype: torch.dtype | np.dtype | type = torch.int64,
        device: torch.device | str = "cpu",
        sample_device: torch.device | str | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
        prioritized: bool = False,
        alpha: float = 0.6,
        priority_eps: float = 1e-6,
        seed: int | None = None,
    ) -> None:
        if num_envs < 1 or capacity < num_envs:
            raise ValueError(f"capacity ({capacity}) must be at least num_envs ({num_envs}) >= 1")
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        self.capacity, self.num_envs = capacity, num_envs
        self.rows = capacity // num_envs + 1  # + the cursor row (newest next_obs, no transition)
        self.obs_shape, self.action_shape = tuple(obs_shape), tuple(action_shape)
        self.device = torch.device(device)
        self.sample_device = torch.device(sample_device) if sample_device else self.device
        self.n_step, self.gamma = n_step, gamma
        self.prioritized, self.alpha, self.priority_eps = prioritized, alpha, priority_eps
        R, N, dev = self.rows, num_envs, self.device
        self.obs = torch.zeros((R, N, *self.obs_shape), dtype=_torch_dtype(obs_dtype), device=dev)
        self.actions = torch.zeros(
            (R, N, *self.action_shape), dtype=_torch_dtype(action_dtype), device=dev
        )
        self.rewards = torch.zeros((R, N), device=dev)
        self.terminated = torch.zeros((R, N), dtype=torch.bool, device=dev)
        self.truncated = torch.zeros((R, N), dtype=torch.bool, device=dev)
        self.valid = torch.zeros((R, N), dtype=torch.bool, device=dev)  # False: pseudo-step
        self.cursor = 0  # the row the next add writes
        self.added = 0  # vector steps added in total
        self.max_priority = 1.0
        self.tree = SumTree(R * N) if prioritized else None
        self.generator = np.random.default_rng(seed)
        self._last_next_obs: torch.Tensor | None = None  # the previous add's next_obs
        self._last_done = torch.zeros(num_envs, dtype=torch.bool)

    # -- writing ----------------------------------------------------------------------------

    def add(
        self,
        obs: Array,
        action: Array,
        reward: Array,
        next_obs: Array,
        terminated: Array,
        truncated: Array,
    ) -> None:
        """Record one vector step (pseudo-steps included: they are recognised and skipped).

        When `obs` does not continue the stream (it differs from the previous next_obs, as
        after a manual reset or with SAME_STEP autoreset), a break row keeps the previous
        next_obs and the transition goes into the row after it.
        """
        N = self.num_envs
        obs = checked(obs, "obs", (N, *self.obs_shape), self.obs.dtype)
        next_obs = checked(next_obs, "next_obs", (N, *self.obs_shape), self.obs.dtype)
        action = checked(action, "action", (N, *self.action_shape), self.actions.dtype)
        reward = checked(reward, "reward", (N,), torch.float32)
        terminated = checked(terminated, "terminated", (N,), torch.bool)
        truncated = checked(truncated, "truncated", (N,), torch.bool)
        # The stream check and the validity flags use the caller's arrays (host memory in the
        # usual case), so a CUDA buffer pays no device synchronisation for them.
        if self.added == 0:
            continues = False
        elif self._last_next_obs is not None:
            continues = torch.equal(self._last_next_obs, obs)
        else:  # just loaded from a state dict
            continues = torch.equal(self.obs[self.cursor], obs.to(self.device, self.obs.dtype))
        if continues:
            valid = ~self._last_done  # the step after a done is a pseudo-step
        else:
            if self.added:  # a break row keeps the previous next_obs
                no = torch.zeros(N, dtype=torch.bool)
                self._write(
                    self.obs[self.cursor], self.actions[self.cursor], torch.zeros(N), no, no, no
                )
            valid = torch.ones(N, dtype=torch.bool)
        self.obs[self.cursor].copy_(obs)
        self._write(next_obs, action, reward, terminated, truncated, valid)
        self._last_next_obs = next_obs.clone()
        self._last_done = terminated | truncated

    def _write(self, next_obs, action, reward, terminated, truncated, valid) -> None:
        """Fill the cursor row (its obs is already in place) and advance the cursor."""
        N, row = self.num_envs, self.cursor
        nxt = (row + 1) % self.rows
        self.obs[nxt].copy_(next_obs)
        self.actions[row].copy_(action)
        self.rewards[row].copy_(reward)
        self.terminated[row].copy_(terminated)
        self.truncated[row].copy_(truncated)
        self.valid[row].copy_(valid)
        self.valid[nxt] = False  # its obs now holds our next_obs: no transition there yet
        if self.tree is not None:
            slots = np.arange(N)
            new = np.where(valid.cpu().numpy(), self.max_priority**self.alpha, 0.0)
            self.tree.update(
                np.concatenate([row * N + slots, nxt * N + slots]),
                np.concatenate([new, np.zeros(N)]),
            )
        self.cursor = nxt
        self.added += 1

    # -- size -------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of transitions that can be sampled (pseudo-steps excluded)."""
        return int(self.valid.sum())

    def ready(self, batch_size: int) -> bool:
        return len(self) >= batch_size

    # -- sampling ---------------------------------------------------------------------------

    def sample(self, batch_size: int, beta: float = 0.4) -> ReplayBatch:
        """A batch of `batch_size` transitions drawn with replacement, on `sample_device`.

        Uniform, or proportional to priority^alpha with importance weights for `beta`.
        """
        if len(self) == 0:
            raise ValueError("cannot sample from an empty buffer; check ready(batch_size) first")
        if self.tree is not None:
            total = self.tree.total
            mass = (np.arange(batch_size) + self.generator.random(batch_size)) * (
                total / batch_size
            )
            flat = self.tree.find(np.minimum(mass, np.nextafter(total, 0)))
            probs = self.tree.leaves[flat] / total
            weights = (len(self) * probs) ** -beta
            weights = torch.as_tensor(
                weights / weights.max(), dtype=torch.float32, device=self.device
            )
        else:
            valid_flat = np.flatnonzero(self.valid.reshape(-1).cpu().numpy())
            flat = valid_flat[self.generator.integers(0, len(valid_flat), batch_size)]
            weights = torch.ones(batch_size, device=self.device)
        index = torch.as_tensor(flat, device=self.device)
        rewards, discounts, terminated, next_index = self._n_step(index)
        flat_obs = self.obs.view(-1, *self.obs_shape)  # flat (row * N + env) indexing is fast
        batch = ReplayBatch(
            obs=flat_obs[index],
            actions=self.actions.view(-1, *self.action_shape)[index],
            rewards=rewards,
            next_obs=flat_obs[next_index],
            terminated=terminated,
            discounts=discounts,
            weights=weights,
            indices=index,
        )
        return ReplayBatch(*(x.to(self.sample_device, non_blocking=True) for x in batch))

    def _n_step(self, index: torch.Tensor):
        """Discounted reward sums over windows of up to n steps from flat slots `index`.

        A window stops after its first done or at the newest row. Returns the sums, gamma^k,
        whether the window ended by termination, and the flat slot of the bootstrap obs.
        """
        size = self.rows * self.num_envs  # stepping one row ahead is + num_envs, mod size
        rewards, valid = self.rewards.view(-1), self.valid.view(-1)
        terminated_flags, truncated_flags = self.terminated.view(-1), self.truncated.view(-1)
        returns = rewards[index].clone()
        discount = torch.full_like(returns, self.gamma)
        terminated = terminated_flags[index].clone()
        open_ = ~(terminated | truncated_flags[index])
        end = (index + self.num_envs) % size
        for _ in range(1, self.n_step):
            slot = end
            # invalid rows end the window: the cursor row, pseudo-steps and breaks
            open_ = open_ & valid[slot]
            returns += open_ * discount * rewards[slot]
            discount = torch.where(open_, discount * self.gamma, discount)
            end = torch.where(open_, (slot + self.num_envs) % size, end)
            term = terminated_flags[slot]
            terminated |= open_ & term
            open_ = open_ & ~(term | truncated_flags[slot])
        return returns, discount, terminated, end

    def update_priorities(self, indices: Array, td_errors: Array) -> None:
        """Set the priorities of sampled transitions to (|td_error| + eps)^alpha."""
        if self.tree is None:
            raise RuntimeError("update_priorities needs a prioritized buffer (prioritized=True)")
        index = torch.as_tensor(indices).cpu().numpy()
        priority = np.abs(torch.as_tensor(td_errors).detach().cpu().numpy()) + self.priority_eps
        self.max_priority = max(self.max_priority, float(priority.max()))
        # Slots overwritten since sampling (or now invalid) keep priority 0.
        still_valid = self.valid.reshape(-1).cpu().numpy()[index]
        self.tree.update(index, np.where(still_valid, priority**self.alpha, 0.0))

    # -- persistence ------------------------------------------------------------------------

    _TENSORS = ("obs", "actions", "rewards", "terminated", "truncated", "valid")

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {name: getattr(self, name).cpu().clone() for name in self._TENSORS}
        state.update(
            cursor=self.cursor,
            added=self.added,
            max_priority=self.max_priority,
            n_step=self.n_step,
            gamma=self.gamma,
            alpha=self.alpha,
            priorities=torch.from_numpy(self.tree.leaves.copy()) if self.tree else None,
            rng=self.generator.bit_generator.state,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["priorities"] is None) != (self.tree is None):
            raise ValueError("prioritized and uniform buffers cannot load each other's state")
        load_tensors(self, self._TENSORS, state)
        prev = (int(state["cursor"]) - 1) % self.rows
        self._last_next_obs = None
        self._last_done = (self.terminated[prev] | self.truncated[prev]).cpu()
        self.cursor, self.added = int(state["cursor"]), int(state["added"])
        self.max_priority = float(state["max_priority"])
        self.n_step, self.gamma, self.alpha = int(state["n_step"]), state["gamma"], state["alpha"]
        if self.tree is not None:
            self.tree.update(np.arange(self.tree.size), state["priorities"].numpy())
        self.generator.bit_generator.state = state["rng"]

    def save(self, path: str | Path) -> None:
        """Write the buffer atomically (temporary file, fsync, rename); loading runs no code."""
        atomic_save(self.state_dict(), path)

    def load(self, path: str | Path) -> None:
        self.load_state_dict(safe_load(path))
