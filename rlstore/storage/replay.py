"""ReplayBuffer: the off-policy buffer of DQN, with n-step returns and prioritized replay.

Layout: a ring of `rows` vector steps, each row holding one transition per env, in
preallocated tensors: observations on the buffer's device, the small fields (actions,
rewards, flags) in host memory. Each observation is stored once: the next observation
of row i is the observation of row i + 1 (same env). This is exact under Gymnasium's
NEXT_STEP autoreset, where the stream of observations of one env is
    o_0, o_1, ..., o_final, o_reset, o'_1, ...
The step taken at o_final is a pseudo-step (action ignored, reward 0, next obs o_reset): it
gets a row, marked invalid and never sampled, whose observation slot holds o_final, the
true final observation that a truncated transition bootstraps from. `add` checks, env by
env, that each call continues the stream (its obs is the previous call's next_obs).

A client whose envs autoreset in SAME_STEP mode (or not at all) makes no pseudo-steps and
says so (`autoreset_mode="same_step"`): every add is then a transition, also one whose obs
equals the previous next_obs after a done (SAME_STEP clients pass the reset observation as
next_obs at a termination, where it is never bootstrapped from).

When some env's stream breaks (a manual or partial reset, or SAME_STEP autoreset), a break
row keeps every env's previous next_obs and holds no transition. A break is found from the
data (obs differs from the previous next_obs), or told: `end_episodes` (a reset observation
can equal the last observation in small envs). For the envs whose stream
goes on through it, the break row is a bridge: it repeats their observation, and n-step
windows step over it.

The row at the write cursor holds the newest next_obs and no transition, so a buffer of
capacity C per env keeps C + 1 rows. n-step windows stop at the first done, at the newest
row, and never read across the cursor.

Frame stacks (Atari, `frame_stack=k`; storage/frame_stacks.py): each frame is stored once,
and a stack is rebuilt from a row's newest frame and those of the rows above it, or the
padding the env put where its stream started. A row whose stacks can no longer be rebuilt
(its frames overwritten) is `lost`: still part of the n-step windows before it, never
sampled.

Observations made of parts (Dict and Tuple spaces; rlstore/parts.py) are kept part by
part, each in its own dtype, with the same layout and rules: `obs_shape` and `obs_dtype`
are then dicts or tuples of shapes and dtypes, and a batch's obs and next_obs dicts or
tuples of tensors. A stream goes on where every part of its observation does.

Action masks (`action_mask_shape`) are kept as a part of each row's observation slot:
`obs` is then the pair (observations, masks), and a batch's `action_masks` and
`next_action_masks` are the masks of its obs and next_obs, taken from the same slots by
the same rules (DQN's target maximizes over the next state's allowed actions).

Prioritized replay (proportional, Schaul et al. 2016; storage/priorities.py): a sum tree
over all (row, env) slots holds priority^alpha; invalid slots hold 0. New transitions get
the maximum priority seen so far; importance weights (N * P(i))^-beta are divided by the
batch maximum. A sampled batch's `indices` name transitions, not slots: `write * num_envs
+ env`, where `write` counts the rows written so far. So update_priorities can tell a
transition that is still stored from a new one that has since taken its slot, and leaves
the new one alone.

Hindsight experience replay (`hindsight`; storage/hindsight.py): for goal-conditioned Dict
observations, each row also records its episode's extent, and a sampled batch relabels its
first transitions with goals reached later in their own episodes (one-step targets, uniform
sampling).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from rlstore.files import atomic_save, safe_load
from rlstore.parts import Tree, check_parts, is_shape, leaves, map_parts, map_shapes, take
from rlstore.storage.arrays import Array, copy_in, host_array, load_tensors, to_device, torch_dtype
from rlstore.storage.frame_stacks import FrameStacks
from rlstore.storage.hindsight import EpisodeIndex, Hindsight
from rlstore.storage.priorities import Priorities


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


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _itemsize(dtype: torch.dtype | np.dtype | type) -> int:
    return torch_dtype(dtype).itemsize


def _fingerprint(obs: Tree) -> tuple[tuple[np.dtype, bytes], ...]:
    """Each part's (dtype, bytes): comparing bytes is much faster than np.array_equal."""
    if type(obs) is np.ndarray:
        return ((obs.dtype, obs.tobytes()),)
    return tuple((part.dtype, part.tobytes()) for part in leaves(obs))


def _host_obs(given: Array, name: str, mine: torch.Tensor) -> np.ndarray:
    """An observation part given for one row of `mine` (a part's storage), checked."""
    return host_array(given, name, mine.shape[1:], mine.dtype)


def _with_masks(shapes: Tree, dtypes: Tree, mask_shape: tuple[int, ...]) -> tuple[Tree, Tree]:
    """The shapes and dtypes of a slot that keeps (observation, action mask)."""
    dtypes = map_shapes(lambda _, dtype: dtype, shapes, dtypes)  # one per part
    return (shapes, tuple(mask_shape)), (dtypes, torch.bool)


def _slots(obs: Array) -> Array:
    """A part's (rows, num_envs, ...) storage seen as (slots, ...)."""
    return obs.reshape(-1, *obs.shape[2:])


def _gather(array: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """The slots `flat` (any shape) of a host (rows, num_envs, ...) array: np.take, which
    for index arrays of two dimensions is about 4x faster than indexing."""
    return np.take(_slots(array), flat, axis=0)


def autoreset_mode_name(mode: str | gym.vector.AutoresetMode) -> str:
    """ "next_step" or "same_step" for a mode given by name or as Gymnasium's AutoresetMode
    (DISABLED, where the client resets envs itself, stores like SAME_STEP: no pseudo-steps)."""
    if isinstance(mode, gym.vector.AutoresetMode):
        return "next_step" if mode == gym.vector.AutoresetMode.NEXT_STEP else "same_step"
    if mode not in ("next_step", "same_step"):
        raise ValueError(f"autoreset_mode must be 'next_step' or 'same_step', got {mode!r}")
    return mode


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
        fit before it is made (the tests compare this with real buffers)."""
        rows = -(-capacity // num_envs) + 1
        slots = rows * num_envs
        if frame_stack:
            obs, host = FrameStacks.memory_bytes(slots, num_envs, obs_shape, _itemsize(obs_dtype))
            host += slots  # lost
        else:
            if action_mask_shape is not None:
                obs_shape, obs_dtype = _with_masks(obs_shape, obs_dtype, action_mask_shape)
            per_slot = map_shapes(
                lambda shape, dtype: _numel(shape) * _itemsize(dtype), obs_shape, obs_dtype
            )
            obs, host = slots * sum(leaves(per_slot)), 0
        action = _numel(action_shape) * _itemsize(action_dtype)
        host += slots * (action + 4 + 4)  # action, float32 reward, four bool flags
        if hindsight:
            host += slots * 16 + num_envs * 8  # EpisodeIndex: int64 first and last per slot
        if prioritized:
            host += 2 * (1 << max(slots - 1, 0).bit_length()) * 8  # the sum tree's float64 nodes
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
        self.autoreset_mode = autoreset_mode_name(autoreset_mode)
        self._pseudo_steps = self.autoreset_mode == "next_step"  # after each done
        # Whole rows of num_envs transitions: a capacity that is not a multiple of num_envs
        # is rounded up, never down.
        self.rows = -(-capacity // num_envs) + 1  # + the cursor row (newest next_obs only)
        self.capacity, self.num_envs = (self.rows - 1) * num_envs, num_envs
        self.obs_shape = tuple(obs_shape) if is_shape(obs_shape) else obs_shape
        self.action_shape = tuple(action_shape)
        self.device = torch.device(device)
        self.sample_device = torch.device(sample_device) if sample_device else self.device
        self.n_step, self.gamma = n_step, gamma
        self.prioritized, self.alpha, self.priority_eps = prioritized, alpha, priority_eps
        R, N = self.rows, num_envs
        self.obs_dtype = map_shapes(lambda _, dtype: torch_dtype(dtype), self.obs_shape, obs_dtype)
        self.frame_stack = frame_stack
        self._host_names = self._HOST_TENSORS
        self.stacks: FrameStacks | None = None
        self.action_mask_shape = action_mask_shape
        if frame_stack and action_mask_shape is not None:
            raise ValueError("a frame-stack buffer does not keep action masks")
        if frame_stack:
            if not is_shape(self.obs_shape) or self.obs_shape[:1] != (frame_stack,):
                raise ValueError(
                    f"frame_stack={frame_stack} needs observations of shape (frame_stack, H, W) "
                    f"with frame_stack >= 2, got {self.obs_shape}"
                )
            self.stacks = FrameStacks(
                R, N, self.obs_shape, self.obs_dtype, self.device, start_capacity
            )
            # A transition whose stacks cannot be rebuilt any more: never sampled, though
            # still valid for the n-step windows of the rows before it.
            self.lost = torch.zeros((R, N), dtype=torch.bool)
            self._host_names = (*self._HOST_TENSORS, "lost")
        else:
            shapes, dtypes = self.obs_shape, self.obs_dtype
            if action_mask_shape is not None:  # (observations, masks) in each slot
                shapes, dtypes = _with_masks(shapes, dtypes, action_mask_shape)
            self.obs = map_shapes(
                lambda shape, dtype: torch.zeros((R, N, *shape), dtype=dtype, device=self.device),
                shapes,
                dtypes,
            )
        # Host tensors, written and read through numpy views (no torch call per field).
        self.actions = torch.zeros((R, N, *self.action_shape), dtype=torch_dtype(action_dtype))
        self.rewards = torch.zeros((R, N))
        self.terminated = torch.zeros((R, N), dtype=torch.bool)
        self.truncated = torch.zeros((R, N), dtype=torch.bool)
        self.valid = torch.zeros((R, N), dtype=torch.bool)  # False: pseudo-step, break, cursor
        self.bridge = torch.zeros((R, N), dtype=torch.bool)  # a break row the stream goes on over
        self._host = {name: getattr(self, name).numpy() for name in self._host_names}
        # A CPU buffer writes its observations through a numpy view too.
        flat_obs = not frame_stack and self.device.type == "cpu"
        self._obs_view = map_parts(torch.Tensor.numpy, self.obs) if flat_obs else None
        self.cursor = 0  # the row the next add writes
        self.added = 0  # rows written in total
        self._count = 0  # valid slots
        self.priorities = Priorities(R * N, alpha, priority_eps) if prioritized else None
        self.generator = np.random.default_rng(seed)
        # The previous add's next_obs as _fingerprint gives it. None: unknown (fresh, or
        # just loaded).
        self._last_next_obs: tuple[tuple[np.dtype, bytes], ...] | None = None
        self._last_done = np.zeros(num_envs, dtype=bool)
        self._ended = np.zeros(num_envs, dtype=bool)  # told by end_episodes, until the next add
        self._bridge_rows: set[int] = set()  # rows with a bridge (rare): n-step checks them
        self.hindsight = hindsight
        self.episodes = EpisodeIndex(R, N) if hindsight is not None else None
        if hindsight is not None:
            self._check_hindsight()

    def _check_hindsight(self) -> None:
        """A ValueError unless relabelling can apply: goal Dict observations, one-step
        targets (an n-step sum would need every reward of the window recomputed), uniform
        sampling (priorities belong to the stored transitions, not the relabelled ones)."""
        shape = self.obs_shape
        if not (isinstance(shape, dict) and "achieved_goal" in shape and "desired_goal" in shape):
            raise ValueError(
                "hindsight relabelling needs Dict observations with 'achieved_goal' and "
                f"'desired_goal' parts, got {shape}"
            )
        if shape["achieved_goal"] != shape["desired_goal"]:
            raise ValueError(
                f"achieved_goal {shape['achieved_goal']} and desired_goal "
                f"{shape['desired_goal']} must have the same shape to relabel"
            )
        if self.n_step != 1 or self.prioritized or self.frame_stack:
            raise ValueError("hindsight relabelling takes n_step=1, uniform sampling, no stacks")

    # -- writing ----------------------------------------------------------------------------

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
        N = self.num_envs
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
        if self.stacks is not None:
            shape, dtype = (N, *self.obs_shape), self.obs_dtype
            obs = host_array(obs, "obs", shape, dtype)
            next_obs = host_array(next_obs, "next_obs", shape, dtype)
        else:
            obs = check_parts(_host_obs, obs, self.obs, "obs")
            next_obs = check_parts(_host_obs, next_obs, self.obs, "next_obs")
        action = host_array(action, "action", (N, *self.action_shape), self.actions.dtype)
        reward = host_array(reward, "reward", (N,), torch.float32)
        terminated = host_array(terminated, "terminated", (N,), torch.bool)
        truncated = host_array(truncated, "truncated", (N,), torch.bool)
        # the next step is a pseudo-step (NEXT_STEP autoreset only)
        env_reset = (terminated | truncated) if self._pseudo_steps else np.zeros(N, dtype=bool)
        if life_lost is not None:
            terminated = terminated | host_array(life_lost, "life_lost", (N,), torch.bool)
        continues = self._continues(obs)
        if self._ended.any():  # (end_episodes: a new stream, whatever the data say)
            continues = (np.ones(N, dtype=bool) if continues is None else continues) & ~self._ended
            self._ended = np.zeros(N, dtype=bool)
        if continues is None:
            valid = ~self._last_done  # the step after a done is a pseudo-step
        else:
            if self.added:  # a break row keeps every env's previous next_obs
                if self.episodes is not None:
                    self.episodes.cut(self.added, ~continues)
                no = np.zeros(N, dtype=bool)
                actions = self._host["actions"][self.cursor]
                self._advance(actions, np.zeros(N), no, no, no, bridge=continues)
            self._put_obs(self.cursor, obs, self.added)
            valid = np.where(continues, ~self._last_done, True)
        self._put_obs((self.cursor + 1) % self.rows, next_obs, self.added + 1, previous=obs)
        if self.episodes is not None:
            self.episodes.add(self.added, valid, terminated | truncated)
        self._advance(action, reward, terminated, truncated, valid)
        self._last_next_obs = _fingerprint(next_obs)
        self._last_done = env_reset

    def add_one(
        self, action: int, reward: float, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> None:
        """add() for a one-env buffer of flat observations in host memory with uniform
        sampling, whose stream goes on (its obs is the previous add's next_obs, which the
        caller knows, and no end_episodes since): the same state as add(), from Python
        scalars, without add's checks and batched bookkeeping (LeanDQNStep's fast path)."""
        host, row = self._host, self.cursor
        following = (row + 1) % self.rows
        valid = not self._last_done[0]  # the step after a done is a pseudo-step
        self._obs_view[following] = next_obs
        host["actions"][row, 0] = action
        host["rewards"][row, 0] = reward
        host["terminated"][row, 0] = terminated
        host["truncated"][row, 0] = truncated
        host["valid"][row, 0] = valid
        if self._bridge_rows:
            for old in {row, following} & self._bridge_rows:
                host["bridge"][old] = False
                self._bridge_rows.discard(old)
        self._count += valid - bool(host["valid"][following, 0])
        host["valid"][following, 0] = False
        self.cursor, self.added = following, self.added + 1
        self._last_next_obs = None  # (the next add() compares with the stored row)
        self._last_done[0] = (terminated or truncated) and self._pseudo_steps

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
        self._ended |= ended

    @property
    def last_done(self) -> np.ndarray:
        """Per env, whether the last add ended an episode whose next step is a pseudo-step
        (never under SAME_STEP autoreset)."""
        return self._last_done.copy()

    def _continues(self, obs: Tree) -> np.ndarray | None:
        """Per env, whether `obs` is the previous add's next_obs, every part of it (its
        stream goes on); None when every env's is (the usual case, told at once by
        comparing bytes)."""
        N = self.num_envs
        if self.added == 0:
            return np.zeros(N, dtype=bool)
        if self._last_next_obs is None:  # just loaded: compare with the stored row, as stored
            stored = self.stored_obs(self.cursor * N + np.arange(N))
            previous = [part.cpu().numpy() for part in leaves(stored)]
            # (MuJoCo's float64 kept as float32)
            given = [
                o.astype(p.dtype, copy=False) for o, p in zip(leaves(obs), previous, strict=True)
            ]
        else:
            fingerprint = _fingerprint(obs)
            if fingerprint == self._last_next_obs:
                return None
            previous = [np.frombuffer(data, dtype=dtype) for dtype, data in self._last_next_obs]
            given = leaves(obs)
        continues = np.ones(N, dtype=bool)
        for before, now in zip(previous, given, strict=True):
            if before.dtype != now.dtype:
                return np.zeros(N, dtype=bool)
            continues &= (before.reshape(N, -1) == now.reshape(N, -1)).all(axis=1)
        return None if continues.all() else continues

    def _put_obs(self, row: int, obs: Tree, write: int, previous: Tree | None = None) -> None:
        """Store the observations of `row` (the `write`-th row written); `previous` is the
        row above's, when the stream may go on from it."""
        if self.stacks is None:
            if type(obs) is np.ndarray and self._obs_view is not None:  # the usual case
                self._obs_view[row] = obs
            elif self._obs_view is not None:
                map_parts(lambda view, part: view.__setitem__(row, part), self._obs_view, obs)
            else:
                map_parts(
                    lambda mine, part: copy_in(
                        mine[row], torch.from_numpy(np.ascontiguousarray(part))
                    ),
                    self.obs,
                    obs,
                )
            return
        lost, overwritten = self.stacks.put(row, obs, write, previous)
        self._mark_lost(lost)
        for start_write, env, slot in overwritten:
            self._forget_segment_start(start_write, env, slot)

    def _mark_lost(self, flat: np.ndarray) -> None:
        """Flat slots whose stacks can no longer be rebuilt: they stop being sampled."""
        valid, lost = self._host["valid"].reshape(-1), self._host["lost"].reshape(-1)
        flat = flat[valid[flat] & ~lost[flat]]
        if len(flat):
            lost[flat] = True
            self._count -= len(flat)
            if self.priorities is not None:
                self.priorities.clear(flat)

    def _forget_segment_start(self, write: int, env: int, slot: int) -> None:
        """Start slot `slot` was reused: the rows of the segment that began at row `write`
        whose stacks needed it become lost, and so do the rows before them whose n-step
        window bootstraps from one of those."""
        R, N = self.rows, self.num_envs

        def stored(w: int) -> bool:  # still in the buffer and not the row being written
            return self.added + 1 - R < w < self.added

        lost = self.stacks.segment_needs(write, env, slot, stored)
        if not lost:
            return
        self._mark_lost(np.array(lost))
        reach = self.n_step + 1 + len(self._bridge_rows)  # bridges lengthen a window
        before = np.array([(w % R) * N + env for w in range(write - reach, write) if stored(w)])
        if len(before):
            ends = self._n_step(before)[3]
            self._mark_lost(before[np.isin(ends, lost)])

    def stored_obs(self, flat: np.ndarray) -> Tree:
        """The observations of flat slots (row * num_envs + env), as stored or rebuilt."""
        if self.stacks is not None:
            return self.stacks.stacks(flat)
        if self._obs_view is not None:  # in host memory: numpy's gather costs less
            return map_parts(lambda view: torch.from_numpy(_gather(view, flat)), self._obs_view)
        index = to_device(torch.from_numpy(flat), self.device)
        return map_parts(lambda obs: _slots(obs)[index], self.obs)

    def _advance(self, action, reward, terminated, truncated, valid, bridge=None) -> None:
        """Fill the cursor row's transition fields (its obs is in place), move the cursor on."""
        N, row, host = self.num_envs, self.cursor, self._host
        nxt = (row + 1) % self.rows
        host["actions"][row] = action
        host["rewards"][row] = reward
        host["terminated"][row] = terminated
        host["truncated"][row] = truncated
        host["valid"][row] = valid
        if self._bridge_rows:  # this row is rewritten, the next one becomes the cursor row
            for old in {row, nxt} & self._bridge_rows:
                host["bridge"][old] = False
                self._bridge_rows.discard(old)
        if bridge is not None and bridge.any():
            host["bridge"][row] = bridge
            self._bridge_rows.add(row)
        # The next row's obs now holds our next_obs: no transition there yet.
        if self.frame_stack:  # a rewritten row starts afresh; lost slots are not counted
            host["lost"][row] = False
            self._count += np.count_nonzero(host["valid"][nxt] & host["lost"][nxt])
            host["lost"][nxt] = False
        self._count += np.count_nonzero(valid) - np.count_nonzero(host["valid"][nxt])
        host["valid"][nxt] = False
        if self.priorities is not None:
            slots = np.arange(N)
            self.priorities.add(row * N + slots, valid, cleared=nxt * N + slots)
        self.cursor = nxt
        self.added += 1

    # -- size -------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of transitions that can be sampled (pseudo-steps excluded)."""
        return self._count

    def ready(self, batch_size: int) -> bool:
        return self._count >= batch_size

    # -- sampling ---------------------------------------------------------------------------

    def sample(self, batch_size: int, beta: float = 0.4) -> ReplayBatch:
        """A batch of `batch_size` transitions drawn with replacement, on `sample_device`.

        Uniform, or proportional to priority^alpha with importance weights for `beta`.
        `indices` (for update_priorities) name the transitions and stay in host memory.
        """
        flat, next_flat, rewards, discounts, terminated, weights = self._draw(batch_size, beta)
        obs = self.stored_obs(np.stack((flat, next_flat)))  # obs and next_obs in one gather
        if self.hindsight is not None:
            rewards, terminated = self._relabel(obs, flat, next_flat, rewards, terminated)
        scalars = np.stack((rewards, discounts, weights, terminated), dtype=np.float32)
        actions = torch.from_numpy(_gather(self._host["actions"], flat))
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
        obs, next_obs = take(obs, 0), take(obs, 1)
        masks = {}
        if self.action_mask_shape is not None:
            (obs, masks["action_masks"]), (next_obs, masks["next_action_masks"]) = obs, next_obs
        return ReplayBatch(
            obs=obs,
            actions=actions,
            rewards=rewards,
            next_obs=next_obs,
            terminated=terminated,
            discounts=discounts,
            weights=weights,
            indices=torch.from_numpy(self._transition_ids(flat)),
            **masks,
        )

    def sample_host(self, batch_size: int, beta: float = 0.4) -> ReplayBatch:
        """sample() as numpy arrays, for a buffer of flat observations in host memory: the
        same draws and values, without making tensors (the numpy gradient step's input)."""
        if self._obs_view is None or self.frame_stack:
            raise ValueError("sample_host needs a buffer of flat observations in host memory")
        flat, next_flat, rewards, discounts, terminated, weights = self._draw(batch_size, beta)
        both = np.stack((flat, next_flat))
        stored = map_parts(lambda view: _gather(view, both), self._obs_view)
        if self.hindsight is not None:
            rewards, terminated = self._relabel(stored, flat, next_flat, rewards, terminated)
        obs, next_obs, masks = take(stored, 0), take(stored, 1), {}
        if self.action_mask_shape is not None:
            (obs, masks["action_masks"]), (next_obs, masks["next_action_masks"]) = obs, next_obs
        return ReplayBatch(
            obs=obs,
            actions=_gather(self._host["actions"], flat),
            rewards=rewards.astype(np.float32),
            next_obs=next_obs,
            terminated=terminated,
            discounts=discounts.astype(np.float32),
            weights=weights.astype(np.float32),
            indices=self._transition_ids(flat),
            **masks,
        )

    def _draw(self, batch_size: int, beta: float) -> tuple[np.ndarray, ...]:
        """A batch's flat slots, the flat slots of its bootstrap observations, its n-step
        rewards, discounts and terminations, and its importance weights."""
        if self._count == 0:
            raise ValueError("cannot sample from an empty buffer; check ready(batch_size) first")
        if self.priorities is not None:
            flat, weights = self.priorities.draw(batch_size, self._count, beta, self.generator)
        else:
            flat = self._uniform(batch_size)
            weights = np.ones(batch_size)
        rewards, discounts, terminated, next_flat = self._n_step(flat)
        return flat, next_flat, rewards, discounts, terminated, weights

    def _relabel(
        self,
        obs: Tree,
        flat: np.ndarray,
        next_flat: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Hindsight: give the batch's first transitions goals their episodes reached.
        `obs` holds the batch's obs and next_obs, stacked (as gathered); their desired goals
        are replaced in place. The rewards and terminations, the relabelled ones recomputed."""
        n = self.hindsight.relabelled(len(flat))
        if n == 0:
            return rewards, terminated
        valid = self._host["valid"].reshape(-1)
        goal_flat = self.episodes.goal_slots(
            flat[:n], self.added, valid, self.hindsight.strategy, self.generator
        )
        slots = np.concatenate((next_flat[:n], goal_flat))
        if self._obs_view is not None:
            both = _gather(self._goal_part(self._obs_view, "achieved_goal"), slots)
        else:
            index = to_device(torch.from_numpy(slots), self.device)
            both = _slots(self._goal_part(self.obs, "achieved_goal"))[index].cpu().numpy()
        next_achieved, goals = both[:n], both[n:]
        desired = self._goal_part(obs, "desired_goal")  # (2, batch, *goal_shape)
        desired[:, :n] = goals if isinstance(desired, np.ndarray) else torch.from_numpy(goals)
        relabelled, ends = self.hindsight.rewards_and_terminations(
            next_achieved, goals, terminated[:n]
        )
        rewards, terminated = rewards.copy(), terminated.copy()
        rewards[:n], terminated[:n] = relabelled, ends
        return rewards, terminated

    def _goal_part(self, obs: Tree, key: str) -> Array:
        """The `key` part of an observation tree (the first of the pair with masks)."""
        return (obs[0] if self.action_mask_shape is not None else obs)[key]

    def _transition_ids(self, flat: np.ndarray) -> np.ndarray:
        """write * num_envs + env for flat slots: `write` is the add count when the row was
        written, the latest write to that row (rows are written in turn, write % rows)."""
        row, env = np.divmod(flat, self.num_envs)
        write = self.added - 1 - (self.added - 1 - row) % self.rows
        return write * self.num_envs + env

    def _uniform(self, batch_size: int) -> np.ndarray:
        """Flat slots drawn uniformly from the sampleable ones, by rejection (few are not)."""
        valid = self._host["valid"].reshape(-1)
        lost = self._host["lost"].reshape(-1) if self.frame_stack else None

        def rejected(flat: np.ndarray) -> np.ndarray:
            return ~valid[flat] if lost is None else ~valid[flat] | lost[flat]

        high = min(self.added, self.rows) * self.num_envs  # slots ever written
        flat = self.generator.integers(0, high, batch_size)
        redraw = rejected(flat)
        for _ in range(8):
            if not redraw.any():
                return flat
            flat[redraw] = self.generator.integers(0, high, int(redraw.sum()))
            redraw = rejected(flat)
        if redraw.any():  # mostly invalid slots (tiny buffers): draw from the valid list
            valid_flat = np.flatnonzero(valid if lost is None else valid & ~lost)
            flat[redraw] = valid_flat[self.generator.integers(0, len(valid_flat), redraw.sum())]
        return flat

    def _n_step(self, index: np.ndarray):
        """Discounted reward sums over windows of up to n steps from flat slots `index`.

        A window stops after its first done or at the newest row. Returns the sums, gamma^k,
        whether the window ended by termination, and the flat slot of the bootstrap obs.
        """
        size, N = self.rows * self.num_envs, self.num_envs  # one row ahead is + N, mod size
        rewards, valid, terminated_flags, truncated_flags = (
            self._host[name].reshape(-1) for name in ("rewards", "valid", "terminated", "truncated")
        )
        returns = rewards[index].astype(np.float64)
        discount = np.full(len(index), self.gamma)
        terminated = terminated_flags[index]
        open_ = ~(terminated | truncated_flags[index])
        end = (index + N) % size
        bridge = self._host["bridge"].reshape(-1) if self._bridge_rows else None
        for _ in range(1, self.n_step):
            slot = end
            while bridge is not None and bridge[slot].any():  # the stream goes on after it
                slot = np.where(bridge[slot], (slot + N) % size, slot)
            # invalid rows end the window: the cursor row, pseudo-steps and breaks
            open_ &= valid[slot]
            returns += open_ * discount * rewards[slot]
            discount = np.where(open_, discount * self.gamma, discount)
            end = np.where(open_, (slot + N) % size, end)
            term = terminated_flags[slot]
            terminated = terminated | (open_ & term)
            open_ &= ~(term | truncated_flags[slot])
        return returns, discount, terminated, end

    def update_priorities(self, indices: Array, td_errors: Array) -> None:
        """Set the priorities of sampled transitions to (|td_error| + eps)^alpha.

        `indices` are a batch's (transition ids). A transition that has left the buffer
        since it was sampled is skipped, so a new one written into its slot keeps the
        priority it entered with."""
        if self.priorities is None:
            raise RuntimeError("update_priorities needs a prioritized buffer (prioritized=True)")
        ids = torch.as_tensor(indices).cpu().numpy()
        td_errors = torch.as_tensor(td_errors).detach().cpu().numpy()
        write, env = np.divmod(ids, self.num_envs)
        flat = (write % self.rows) * self.num_envs + env
        # A row is rewritten rows writes later, and invalidated (as the cursor row) one before.
        stored = (self.added - write < self.rows) & self._host["valid"].reshape(-1)[flat]
        if self.frame_stack:
            stored &= ~self._host["lost"].reshape(-1)[flat]
        if not stored.any():
            return
        self.priorities.update(flat[stored], td_errors[stored])

    # -- persistence ------------------------------------------------------------------------

    _HOST_TENSORS = ("actions", "rewards", "terminated", "truncated", "valid", "bridge")

    @property
    def _tensors(self) -> tuple[str, ...]:
        return self._host_names if self.stacks else ("obs", *self._host_names)

    def state_dict(self) -> dict[str, Any]:
        """The buffer's state. Host tensors are the live ones, not copies (as with
        nn.Module.state_dict): a 1M-transition Atari buffer is ~7 GB, and a copy for a
        checkpoint would double that. Save it before the buffer changes."""
        state: dict[str, Any] = {
            name: map_parts(torch.Tensor.cpu, getattr(self, name)) for name in self._tensors
        }
        if self.stacks is not None:
            state.update(self.stacks.state_dict())
        state.update(
            cursor=self.cursor,
            added=self.added,
            max_priority=self.priorities.max_priority if self.priorities else 1.0,
            n_step=self.n_step,
            gamma=self.gamma,
            alpha=self.alpha,
            priorities=self.priorities.leaves() if self.priorities else None,
            rng=self.generator.bit_generator.state,
            last_done=torch.from_numpy(self._last_done.copy()),  # a life loss is no reset
            ended=torch.from_numpy(self._ended.copy()),
            autoreset_mode=self.autoreset_mode,
        )
        if self.episodes is not None:
            state.update(self.episodes.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() into a buffer built with the same arguments."""
        if (state["priorities"] is None) != (self.priorities is None):
            raise ValueError("prioritized and uniform buffers cannot load each other's state")
        if ("episode_start" in state) != (self.episodes is not None):
            raise ValueError("buffers with and without hindsight cannot load each other's state")
        if ("frames" in state) != bool(self.frame_stack):
            raise ValueError("frame-stack and plain buffers cannot load each other's state")
        state = {"autoreset_mode": "next_step", **state}  # (saved before the mode was kept)
        for name in ("n_step", "gamma", "alpha", "autoreset_mode"):
            if state[name] != getattr(self, name):
                raise ValueError(
                    f"the saved buffer has {name}={state[name]}, this one {getattr(self, name)}; "
                    "build the buffer with the saved settings"
                )
        state = {"bridge": torch.zeros_like(self.bridge), **state}  # saved before bridges
        if self.stacks is not None:
            self.stacks.load_state_dict(state)
        load_tensors(self, self._tensors, state)
        prev = (int(state["cursor"]) - 1) % self.rows
        self._last_next_obs = None
        if "last_done" in state:
            self._last_done = state["last_done"].numpy().copy()
        else:  # saved before life losses were kept apart
            self._last_done = self._host["terminated"][prev] | self._host["truncated"][prev]
        ended = state.get("ended")  # (saved before end_episodes)
        self._ended = np.zeros(self.num_envs, bool) if ended is None else ended.numpy().copy()
        self._count = int(self._host["valid"].sum())
        if self.frame_stack:
            self._count -= int((self._host["valid"] & self._host["lost"]).sum())
        self._bridge_rows = set(np.flatnonzero(self._host["bridge"].any(axis=1)).tolist())
        self.cursor, self.added = int(state["cursor"]), int(state["added"])
        if self.priorities is not None:
            self.priorities.load(state["priorities"], float(state["max_priority"]))
        if self.episodes is not None:
            self.episodes.load_state_dict(state)
        self.generator.bit_generator.state = state["rng"]

    def save(self, path: str | Path) -> None:
        """Write the buffer atomically (temporary file, fsync, rename); loading runs no code."""
        atomic_save(self.state_dict(), path)

    def load(self, path: str | Path) -> None:
        self.load_state_dict(safe_load(path))
