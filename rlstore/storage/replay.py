"""ReplayBuffer: the off-policy buffer of the DQN family, SAC, TD3 and their kin: n-step
returns, prioritized replay, frame stacks, action masks and hindsight relabelling, each free
to combine with the others. It is the composition of pieces, each in its module with its
own tests, state_dict and memory_bytes:

    ring.py          rows, write cursor, per-transition fields and flags in host memory, and
                     each env's stream (pseudo-steps, breaks, bridges: its docstring);
    observations.py  the observations, one slot per (row, env), part by part (action masks
                     as one more part), on the buffer's device; or, for Atari,
    frame_stacks.py  frame stacks with each frame stored once;
    samplers.py      uniform or prioritized draws (priorities.py: the sum tree);
    returns.py       n-step windows, a pure function of the ring's flags;
    hindsight.py     goal relabelling, a transform of sampled batches.

Each observation is stored once: the next observation of row i is the observation of row
i + 1. This is exact under Gymnasium's NEXT_STEP autoreset, where the stream of one env is
o_0, o_1, ..., o_final, o_reset, o'_1, ...: the pseudo-step taken at o_final gets a row that
is never sampled, whose slot keeps o_final, the true final observation that a truncated
transition bootstraps from. A batch's `indices` name transitions, not slots, so
update_priorities leaves alone a new transition that has taken a sampled one's slot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from rlstore.files import atomic_save, safe_load
from rlstore.parts import Tree, is_shape, leaves, map_parts, map_shapes, take
from rlstore.storage.arrays import Array, host_array, to_device, torch_dtype
from rlstore.storage.frame_stacks import FrameStacks
from rlstore.storage.hindsight import EpisodeIndex, Hindsight, Relabelling, check_relabelling
from rlstore.storage.migrations import REPLAY_FORMAT, replay_state
from rlstore.storage.observations import FlatObservations, gather, with_masks
from rlstore.storage.ring import Ring, autoreset_mode_name
from rlstore.storage.samplers import PrioritizedSampler, UniformSampler


class ReplayBatch(NamedTuple):
    """A sampled batch. The target is rewards + discounts * (1 - terminated) * V(next_obs).

    rewards: the n-step discounted reward sums; discounts: gamma^k with the real window
    length k; terminated: whether the window ended with a termination. weights are the
    importance weights (ones without prioritized replay); indices go to update_priorities.
    With hindsight, the first `hindsight.relabelled(batch_size)` transitions are relabelled.
    `sample` fills it with tensors, `sample_host` with numpy arrays.
    """

    obs: Tree
    actions: torch.Tensor | np.ndarray
    rewards: torch.Tensor | np.ndarray
    next_obs: Tree
    terminated: torch.Tensor | np.ndarray
    discounts: torch.Tensor | np.ndarray
    weights: torch.Tensor | np.ndarray
    indices: torch.Tensor | np.ndarray
    action_masks: torch.Tensor | np.ndarray | None = None
    next_action_masks: torch.Tensor | np.ndarray | None = None


def _rows(capacity: int, num_envs: int) -> int:
    """Whole rows of num_envs transitions (a capacity that is not a multiple of num_envs is
    rounded up, never down), + the cursor row (the newest next_obs only)."""
    return -(-capacity // num_envs) + 1


class ReplayBuffer:
    """Circular replay storage for `num_envs` envs, one `add` per vector step.

    Observations live on `device`; the small per-transition fields (actions, rewards, flags)
    live in host memory, where sampling draws its indices and sums its n-step windows. So
    neither `add` nor `sample` waits for a GPU: each moves its data with asynchronous copies.

    Typical loop (see rlstore/algos/dqn.py)::

        obs, _ = envs.reset(seed=1)
        for step in range(steps):
            action = ...
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            buffer.add(obs, action, reward, next_obs, terminated, truncated)
            obs = next_obs
            if buffer.ready(128):
                batch = buffer.sample(128)

    `autoreset_mode`: how the client's envs autoreset, "next_step" (Gymnasium's default;
    the step after a done is a pseudo-step and is skipped) or "same_step" (every add is a
    transition: at a truncation pass the true final observation as next_obs, at a
    termination either it or the reset observation). Gymnasium's AutoresetMode is taken too.
    """

    @staticmethod
    def memory_bytes(
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...] | Tree,
        obs_dtype: torch.dtype | np.dtype | type | Tree = torch.float32,
        action_shape: tuple[int, ...] = (),
        action_dtype: torch.dtype | np.dtype | type = torch.int64,
        prioritized: bool = False,
        frame_stack: int = 0,
        action_mask_shape: tuple[int, ...] | None = None,
        hindsight: bool = False,
    ) -> tuple[int, int]:
        """(observation bytes, on the buffer's device; other bytes, in host memory) that a
        buffer of these arguments allocates, so that a caller can refuse one that will not
        fit before it is made: the sum of its pieces' (the tests compare this with real
        buffers)."""
        slots = _rows(capacity, num_envs) * num_envs
        if frame_stack:
            itemsize = torch_dtype(obs_dtype).itemsize
            obs, host = FrameStacks.memory_bytes(slots, num_envs, obs_shape, itemsize)
        else:
            if action_mask_shape is not None:
                obs_shape, obs_dtype = with_masks(obs_shape, obs_dtype, action_mask_shape)
            obs, host = FlatObservations.memory_bytes(slots, obs_shape, obs_dtype), 0
        host += Ring.memory_bytes(slots, action_shape, action_dtype)
        if hindsight:
            host += EpisodeIndex.memory_bytes(slots, num_envs)
        if prioritized:
            host += PrioritizedSampler.memory_bytes(slots)
        return obs, host

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...] | Tree,
        obs_dtype: torch.dtype | np.dtype | type | Tree = torch.float32,
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
        frame_stack: int = 0,
        start_capacity: int | None = None,
        action_mask_shape: tuple[int, ...] | None = None,
        hindsight: Hindsight | None = None,
        autoreset_mode: str | gym.vector.AutoresetMode = "next_step",
    ) -> None:
        if num_envs < 1 or capacity < 1:
            raise ValueError(f"capacity ({capacity}) and num_envs ({num_envs}) must be >= 1")
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
        if frame_stack and action_mask_shape is not None:
            raise ValueError("a frame-stack buffer does not keep action masks")
        self.autoreset_mode = autoreset_mode_name(autoreset_mode)
        self.rows = _rows(capacity, num_envs)
        self.capacity, self.num_envs = (self.rows - 1) * num_envs, num_envs
        self.obs_shape = tuple(obs_shape) if is_shape(obs_shape) else obs_shape
        self.obs_dtype = map_shapes(lambda _, dtype: torch_dtype(dtype), self.obs_shape, obs_dtype)
        self.action_shape = tuple(action_shape)
        self.action_mask_shape = action_mask_shape
        self.device = torch.device(device)
        self.sample_device = torch.device(sample_device) if sample_device else self.device
        self.n_step, self.gamma = n_step, gamma
        self.prioritized, self.alpha, self.priority_eps = prioritized, alpha, priority_eps
        self.frame_stack = frame_stack
        if hindsight is not None:
            check_relabelling(self.obs_shape, n_step, prioritized, frame_stack)
        self.ring = Ring(
            self.rows,
            num_envs,
            self.action_shape,
            torch_dtype(action_dtype),
            pseudo_steps=self.autoreset_mode == "next_step",  # after each done
        )
        self.stacks: FrameStacks | None = None
        self.store: FlatObservations | FrameStacks
        if frame_stack:
            self.store = self.stacks = FrameStacks(
                self.ring,
                frame_stack,
                self.obs_shape,
                self.obs_dtype,
                self.device,
                n_step,
                start_capacity,
            )
        else:
            shapes, dtypes = self.obs_shape, self.obs_dtype
            if action_mask_shape is not None:  # (observations, masks) in each slot
                shapes, dtypes = with_masks(shapes, dtypes, action_mask_shape)
            self.store = FlatObservations(self.rows, num_envs, shapes, dtypes, self.device)
        self.sampler = (
            PrioritizedSampler(self.rows, num_envs, alpha, priority_eps)
            if prioritized
            else UniformSampler()
        )
        self.priorities = self.sampler.priorities  # (None: uniform)
        self.generator = np.random.default_rng(seed)  # the sampler's and hindsight's draws
        self.relabelling = (
            Relabelling(hindsight, self.rows, num_envs, self._goals_of)
            if hindsight is not None
            else None
        )

    # -- what the pieces hold -----------------------------------------------------------------

    @property
    def cursor(self) -> int:
        """The row the next add writes."""
        return self.ring.cursor

    @property
    def added(self) -> int:
        """Rows written in total."""
        return self.ring.added

    @property
    def obs(self) -> Tree:
        """The stored observations (rows, num_envs, ...), a tree of them with parts or masks
        (not with frame stacks: their frames are `stacks.frames`)."""
        if self.stacks is not None:
            raise AttributeError("a frame-stack buffer keeps frames, in buffer.stacks.frames")
        return self.store.obs

    @property
    def hindsight(self) -> Hindsight | None:
        """How the buffer relabels (None: it does not)."""
        return self.relabelling.hindsight if self.relabelling is not None else None

    @property
    def last_done(self) -> np.ndarray:
        """Per env, whether the last add ended an episode whose next step is a pseudo-step
        (never under SAME_STEP autoreset)."""
        return self.ring.last_done.copy()

    def __len__(self) -> int:
        """Number of transitions that can be sampled (pseudo-steps excluded)."""
        return self.ring.count - (self.stacks.lost_count if self.stacks is not None else 0)

    def ready(self, batch_size: int) -> bool:
        return len(self) >= batch_size

    # -- writing ------------------------------------------------------------------------------

    def add(
        self,
        obs: Array,
        action: Array,
        reward: Array,
        next_obs: Array,
        terminated: Array,
        truncated: Array,
        life_lost: Array | None = None,
        action_mask: Array | None = None,
        next_action_mask: Array | None = None,
    ) -> None:
        """Record one vector step (pseudo-steps included: they are recognised and skipped).
        A buffer with action masks takes obs's and next_obs's masks too.

        `life_lost` (Atari): a life ended while the game goes on. Such a transition is stored
        as terminated (its target has no bootstrap, n-step windows end there), but the env was
        not reset, so the next step is a real transition, not a pseudo-step.

        When `obs` does not continue the stream (it differs from the previous next_obs, as
        after a manual reset or with SAME_STEP autoreset), a break row keeps the previous
        next_obs and the transition goes into the row after it.
        """
        N, ring = self.num_envs, self.ring
        if (action_mask is None or next_action_mask is None) != (self.action_mask_shape is None):
            raise ValueError(
                "action_mask and next_action_mask must be given exactly when the buffer was "
                "made with action_mask_shape"
            )
        if self.action_mask_shape is not None:  # kept beside each observation
            shape = (N, *self.action_mask_shape)
            obs = (obs, host_array(action_mask, "action_mask", shape, torch.bool))
            next_obs = (
                next_obs,
                host_array(next_action_mask, "next_action_mask", shape, torch.bool),
            )
        obs, next_obs = self.store.checked(obs, "obs"), self.store.checked(next_obs, "next_obs")
        action = host_array(action, "action", (N, *self.action_shape), ring.actions.dtype)
        reward = host_array(reward, "reward", (N,), torch.float32)
        terminated = host_array(terminated, "terminated", (N,), torch.bool)
        truncated = host_array(truncated, "truncated", (N,), torch.bool)
        # the next step is a pseudo-step (NEXT_STEP autoreset only)
        env_reset = (terminated | truncated) if ring.pseudo_steps else np.zeros(N, dtype=bool)
        if life_lost is not None:
            terminated = terminated | host_array(life_lost, "life_lost", (N,), torch.bool)
        continues = ring.continues(obs, self._cursor_obs)
        if continues is None:
            valid = ~ring.last_done  # the step after a done is a pseudo-step
        else:
            if ring.added:  # a break row keeps every env's previous next_obs
                if self.relabelling is not None:
                    self.relabelling.episodes.cut(ring.added, ~continues)
                no = np.zeros(N, dtype=bool)
                actions = ring.host["actions"][ring.cursor]
                self._write(actions, np.zeros(N), no, no, no, bridge=continues)
            self._put_obs(ring.cursor, obs, ring.added)
            valid = np.where(continues, ~ring.last_done, True)
        self._put_obs(ring.following, next_obs, ring.added + 1, previous=obs)
        if self.relabelling is not None:
            self.relabelling.episodes.add(ring.added, valid, terminated | truncated)
        self._write(action, reward, terminated, truncated, valid)
        ring.streamed(next_obs, env_reset)

    def add_one(
        self,
        action: int,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
        next_action_mask: np.ndarray | None = None,
    ) -> None:
        """add() for a one-env buffer of flat observations in host memory with uniform
        sampling, whose stream goes on (its obs is the previous add's next_obs, which the
        caller knows, and no end_episodes since): the same state as add(), from Python
        scalars, without add's checks and batched bookkeeping (LeanDQNStep's fast path).
        A buffer with action masks takes next_obs's (obs's is stored with it already)."""
        following = self.ring.following
        if (next_action_mask is None) != (self.action_mask_shape is None):
            raise ValueError(
                "next_action_mask must be given exactly when the buffer was made with "
                "action_mask_shape"
            )
        if next_action_mask is None:
            self.store.view[following] = next_obs
        else:
            obs_view, mask_view = self.store.view
            obs_view[following], mask_view[following] = next_obs, next_action_mask
        self.ring.write_one(action, reward, terminated, truncated)

    def end_episodes(self, envs: Array | None = None) -> None:
        """Say that the episodes of `envs` (one bool per env; None: every env) ended where the
        data cannot show it: their next add starts a new stream even where its obs equals
        the previous next_obs (a small env whose reset observation can repeat the last
        one), so n-step windows and hindsight's episodes stop there (SB3's
        truncate_last_trajectory). A break row is written at that add; the last
        transition bootstraps from its next_obs, as at a time limit."""
        ended = np.ones(self.num_envs, dtype=bool) if envs is None else np.asarray(envs, bool)
        if ended.shape != (self.num_envs,):
            raise ValueError(f"envs must be {self.num_envs} booleans, got shape {ended.shape}")
        self.ring.ended |= ended

    def _cursor_obs(self) -> list[np.ndarray]:
        """The parts stored at the cursor row (the previous add's next_obs), on the host."""
        stored = self.stored_obs(self.ring.cursor * self.num_envs + np.arange(self.num_envs))
        return [part.cpu().numpy() for part in leaves(stored)]

    def _put_obs(self, row: int, obs: Tree, write: int, previous: Tree | None = None) -> None:
        """Store the observations of `row` (the `write`-th row written); `previous` is the
        row above's, when the stream may go on from it (frame stacks share its frames)."""
        if self.stacks is None:
            self.store.put(row, obs)
        else:
            self.sampler.forget(self.stacks.put(row, obs, write, previous))

    def _write(self, action, reward, terminated, truncated, valid, bridge=None) -> None:
        """Fill the cursor row's transition fields (its obs is in place), move the cursor on."""
        row, following = self.ring.cursor, self.ring.following
        if self.stacks is not None:  # a rewritten row starts afresh
            self.stacks.rewrite(row, following)
        self.ring.write(action, reward, terminated, truncated, valid, bridge)
        self.sampler.written(row, following, valid)

    def stored_obs(self, flat: np.ndarray) -> Tree:
        """The observations of flat slots (row * num_envs + env), as stored or rebuilt."""
        return self.store.get(flat)

    # -- sampling -----------------------------------------------------------------------------

    def sample(self, batch_size: int, beta: float = 0.4) -> ReplayBatch:
        """A batch of `batch_size` transitions drawn with replacement, on `sample_device`.

        Uniform, or proportional to priority^alpha with importance weights for `beta`.
        `indices` (for update_priorities) name the transitions and stay in host memory.
        """
        flat, next_flat, rewards, discounts, terminated, weights = self._draw(batch_size, beta)
        obs = self.stored_obs(np.stack((flat, next_flat)))  # obs and next_obs in one gather
        if self.relabelling is not None:
            rewards, terminated = self._relabel(obs, flat, next_flat, rewards, terminated)
        scalars = np.stack((rewards, discounts, weights, terminated), dtype=np.float32)
        actions = torch.from_numpy(gather(self.ring.host["actions"], flat))
        if self.sample_device.type == "cpu":  # no copies: tensors on the numpy arrays
            rewards, discounts, weights = (torch.from_numpy(x) for x in scalars[:3])
            terminated = torch.from_numpy(terminated)
        else:  # three host -> device copies (one per part): obs, float fields, actions
            obs = map_parts(lambda part: to_device(part, self.sample_device), obs)
            rewards, discounts, weights, terminated = to_device(
                torch.from_numpy(scalars), self.sample_device
            ).unbind()
            terminated = terminated.bool()
            actions = to_device(actions, self.sample_device)
        return self._batch(obs, actions, rewards, terminated, discounts, weights, flat, torch)

    def sample_host(self, batch_size: int, beta: float = 0.4) -> ReplayBatch:
        """sample() as numpy arrays, for a buffer of flat observations in host memory: the
        same draws and values, without making tensors (the numpy gradient step's input)."""
        if self.stacks is not None or self.store.view is None:
            raise ValueError("sample_host needs a buffer of flat observations in host memory")
        flat, next_flat, rewards, discounts, terminated, weights = self._draw(batch_size, beta)
        stored = self.store.get_host(np.stack((flat, next_flat)))
        if self.relabelling is not None:
            rewards, terminated = self._relabel(stored, flat, next_flat, rewards, terminated)
        actions = gather(self.ring.host["actions"], flat)
        rewards, discounts, weights = (x.astype(np.float32) for x in (rewards, discounts, weights))
        return self._batch(stored, actions, rewards, terminated, discounts, weights, flat, np)

    def _batch(
        self, both, actions, rewards, terminated, discounts, weights, flat, xp
    ) -> ReplayBatch:
        """The batch from its stacked obs and next_obs (and masks, where kept)."""
        obs, next_obs, masks = take(both, 0), take(both, 1), {}
        if self.action_mask_shape is not None:
            (obs, masks["action_masks"]), (next_obs, masks["next_action_masks"]) = obs, next_obs
        ids = self.ring.transition_ids(flat)
        return ReplayBatch(
            obs=obs,
            actions=actions,
            rewards=rewards,
            next_obs=next_obs,
            terminated=terminated,
            discounts=discounts,
            weights=weights,
            indices=torch.from_numpy(ids) if xp is torch else ids,
            **masks,
        )

    def _draw(self, batch_size: int, beta: float) -> tuple[np.ndarray, ...]:
        """A batch's flat slots, the flat slots of its bootstrap observations, its n-step
        rewards, discounts and terminations, and its importance weights."""
        count = len(self)
        if count == 0:
            raise ValueError("cannot sample from an empty buffer; check ready(batch_size) first")
        blocked = self.stacks.blocked() if self.stacks is not None else None
        flat, weights = self.sampler.draw(
            batch_size, beta, self.ring, blocked, count, self.generator
        )
        rewards, discounts, terminated, next_flat = self.ring.windows(flat, self.n_step, self.gamma)
        return flat, next_flat, rewards, discounts, terminated, weights

    def _relabel(self, obs, flat, next_flat, rewards, terminated) -> tuple[np.ndarray, ...]:
        """Hindsight on a gathered batch (storage/hindsight.py's Relabelling)."""
        return self.relabelling.relabel(
            obs,
            flat,
            next_flat,
            rewards,
            terminated,
            lambda slots: self.store.get_host(
                slots, lambda tree: self._goals_of(tree)["achieved_goal"]
            ),
            self.ring.added,
            self.ring.flat("valid"),
            self.generator,
        )

    def _goals_of(self, tree: Tree) -> Tree:
        """The goal Dict of an observation tree (the first of the pair with masks)."""
        return tree[0] if self.action_mask_shape is not None else tree

    def update_priorities(self, indices: Array, td_errors: Array) -> None:
        """Set the priorities of sampled transitions to (|td_error| + eps)^alpha.

        `indices` are a batch's (transition ids). A transition that has left the buffer
        since it was sampled is skipped, so a new one written into its slot keeps the
        priority it entered with."""
        if not self.prioritized:
            raise RuntimeError("update_priorities needs a prioritized buffer (prioritized=True)")
        ids = torch.as_tensor(indices).cpu().numpy()
        td_errors = torch.as_tensor(td_errors).detach().cpu().numpy()
        flat, stored = self.ring.slots_of(ids)
        if self.stacks is not None:
            stored &= ~self.stacks.blocked()[flat]
        if not stored.any():
            return
        self.sampler.update(flat[stored], td_errors[stored])

    # -- persistence --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state: its pieces' merged, under the key names of every format before.
        Host tensors are the live ones, not copies (as with nn.Module.state_dict): a
        1M-transition Atari buffer is ~7 GB, and a copy for a checkpoint would double that.
        Save it before the buffer changes."""
        state: dict[str, Any] = {"format_version": REPLAY_FORMAT}
        state |= self.store.state_dict() | self.ring.state_dict() | self.sampler.state_dict()
        state |= {
            "n_step": self.n_step,
            "gamma": self.gamma,
            "alpha": self.alpha,
            "rng": self.generator.bit_generator.state,
            "autoreset_mode": self.autoreset_mode,
        }
        if self.relabelling is not None:
            state |= self.relabelling.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() (of this format or an older one: storage/migrations.py) into
        a buffer built with the same arguments."""
        state = replay_state(state)
        if (state["priorities"] is None) != (not self.prioritized):
            raise ValueError("prioritized and uniform buffers cannot load each other's state")
        if ("episode_start" in state) != (self.relabelling is not None):
            raise ValueError("buffers with and without hindsight cannot load each other's state")
        if ("frames" in state) != bool(self.frame_stack):
            raise ValueError("frame-stack and plain buffers cannot load each other's state")
        for name in ("n_step", "gamma", "alpha", "autoreset_mode"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the saved buffer has {name}={state[name]}, this one {getattr(self, name)}; "
                    "build the buffer with the saved settings"
                )
        self.ring.load_state_dict(state)
        self.store.load_state_dict(state)  # (frame stacks count their lost among the valid)
        self.sampler.load_state_dict(state)
        if self.relabelling is not None:
            self.relabelling.load_state_dict(state)
        self.generator.bit_generator.state = state["rng"]

    def save(self, path: str | Path) -> None:
        """Write the buffer atomically (temporary file, fsync, rename); loading runs no code."""
        atomic_save(self.state_dict(), path)

    def load(self, path: str | Path) -> None:
        self.load_state_dict(safe_load(path))
