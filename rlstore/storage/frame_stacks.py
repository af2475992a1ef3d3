"""Frame-stack observations (Atari) with each frame stored once: the observation store of a
ReplayBuffer built with `frame_stack=k`.

Each observation is a stack of the last k frames. A row of the buffer keeps only its
observation's newest frame, plus its depth: how many of the older frames are the newest
frames of the rows above it (k - 1 once the stream has run for k - 1 steps). Where the
stream starts (the first row, an episode's reset observation, a break), the older frames
are the padding the env put there, kept in a ring of "start stacks" (k - 1 frames each). A
row continues its stream's frames when its older frames equal the previous row's newer
ones, byte for byte; else it starts a new segment. So stacks are rebuilt exactly as the env
returned them, whatever its padding. The start ring holds one entry per 32 slots by
default.

A transition whose stacks can no longer be rebuilt is `lost`: still part of the n-step
windows of the rows before it, never sampled. That happens to the k - 1 rows after a row
that is rewritten (their older frames were its frame), and, when a start-ring entry is
overwritten while its rows are still stored (only with very short episodes), to those rows
and to the few before them whose n-step windows bootstrap from one of them. `put` returns
the slots it made lost, for the sampler to forget.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlstore.parts import is_shape
from rlstore.storage.arrays import Array, copy_in, host_array, load_tensors, to_device
from rlstore.storage.ring import Ring


class FrameStacks:
    """The frames of a ring's `rows` rows of `num_envs` stacks of shape `obs_shape` =
    (k, H, W): one pool on `device` (rows * num_envs row frames, then the start ring's
    (k - 1)-frame stacks), and in host memory each slot's depth, start-ring slot and whether
    it is lost. `n_step`: the buffer's window, to find the rows that bootstrap from a lost
    one."""

    def __init__(
        self,
        ring: Ring,
        k: int,
        obs_shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        n_step: int,
        start_capacity: int | None = None,
    ) -> None:
        rows, num_envs = ring.rows, ring.num_envs
        self.ring, self.n_step = ring, n_step
        if k < 2 or not is_shape(obs_shape) or len(obs_shape) != 3 or obs_shape[0] != k:
            raise ValueError(
                f"frame_stack={k} needs observations of shape (frame_stack, H, W) with "
                f"frame_stack >= 2, got {obs_shape}"
            )
        R, N = rows, num_envs
        if k > R - 1:  # a stack must not reach around the ring
            raise ValueError(f"a frame-stack buffer holds at least {k} transitions per env")
        self.rows, self.num_envs, self.k, self.obs_shape = R, N, k, tuple(obs_shape)
        self.device = device
        self.start_capacity = start_capacity or self.default_start_capacity(R * N, N)
        if self.start_capacity < 4 * N:  # one add never reuses a slot it or the last took
            raise ValueError(f"start_capacity must be at least 4 * num_envs = {4 * N}")
        self.frames = torch.zeros(
            (R * N + self.start_capacity * (k - 1), *obs_shape[1:]), dtype=dtype, device=device
        )
        self.depth = torch.zeros((R, N), dtype=torch.int8)
        self.start_slot = torch.zeros((R, N), dtype=torch.int32)
        self.start_owner = torch.full((self.start_capacity, 2), -1, dtype=torch.int64)
        self.starts_written = 0
        self._depth, self._start_slot = self.depth.numpy(), self.start_slot.numpy()
        self._owner = self.start_owner.numpy()
        self.lost = torch.zeros((R, N), dtype=torch.bool)
        self._lost = self.lost.numpy()
        self.lost_count = 0  # valid slots that are lost
        # In host memory, frames are written and gathered through a numpy view.
        self._view = self.frames.numpy() if device.type == "cpu" else None

    @staticmethod
    def default_start_capacity(slots: int, num_envs: int) -> int:
        return max(64 * num_envs, slots // 32)

    @staticmethod
    def memory_bytes(
        slots: int, num_envs: int, obs_shape: tuple[int, ...], itemsize: int
    ) -> tuple[int, int]:
        """(frame bytes, on the device; host bytes: depth, start slot, start owner) of a
        store for `slots` slots."""
        start_capacity = FrameStacks.default_start_capacity(slots, num_envs)
        frames = slots + start_capacity * (obs_shape[0] - 1)
        frame_bytes = frames * int(np.prod(obs_shape[1:], dtype=np.int64)) * itemsize
        return frame_bytes, slots * (1 + 4 + 1) + start_capacity * 2 * 8  # (+ lost)

    # -- writing ----------------------------------------------------------------------------

    def checked(self, obs: Array, name: str) -> np.ndarray:
        """A row's stacks (one per env) as given, checked."""
        return host_array(obs, name, (self.num_envs, *self.obs_shape), self.frames.dtype)

    def put(
        self, row: int, obs: np.ndarray, write: int, previous: np.ndarray | None = None
    ) -> np.ndarray:
        """Store the stacks `obs` of `row` (the `write`-th row written); `previous` is the
        row above's, when the stream may go on from it. Returns the flat slots (row *
        num_envs + env) this made lost."""
        lost, overwritten = self._put(row, obs, write, previous)
        newly = [self._mark_lost(lost)]
        for start_write, env, slot in overwritten:
            newly += self._forget_segment_start(start_write, env, slot)
        return np.concatenate(newly)

    def _put(
        self, row: int, obs: np.ndarray, write: int, previous: np.ndarray | None
    ) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
        """Store the stacks; return what can no longer be rebuilt: the flat slots of the next
        k - 1 rows that stacked on the frame this row held, and the segments whose start
        stack was overwritten, as (their first row's write, env, start slot)."""
        N, k = self.num_envs, self.k
        lost = self._stacking_on(row)
        if previous is None:
            goes_on = np.zeros(N, dtype=bool)
        else:  # the older frames are the previous stack's newer ones: one frame is new
            goes_on = (obs[:, :-1] == previous[:, 1:]).reshape(N, -1).all(axis=1)
        above = (row - 1) % self.rows
        self._depth[row] = np.where(goes_on, np.minimum(self._depth[above] + 1, k - 1), 0)
        self._start_slot[row] = self._start_slot[above]
        overwritten = []
        for env in np.flatnonzero(~goes_on):  # a new segment: keep the padding frames
            slot = self.starts_written % self.start_capacity
            old_write, old_env = (int(x) for x in self._owner[slot])
            if old_write >= 0:
                overwritten.append((old_write, old_env, slot))
            self._owner[slot] = (write, int(env))
            self.starts_written += 1
            self._start_slot[row, env] = slot
            start = self.rows * N + slot * (k - 1)
            self._write(slice(start, start + k - 1), obs[env, :-1])
        self._write(slice(row * N, (row + 1) * N), obs[:, -1])
        return lost, overwritten

    def _stacking_on(self, row: int) -> np.ndarray:
        """The flat slots of the next k - 1 rows (the oldest stored) whose stacks take a
        frame of `row`."""
        N, found = self.num_envs, []
        for ahead in range(1, self.k):
            later = (row + ahead) % self.rows
            found.append(later * N + np.flatnonzero(self._depth[later] >= ahead))
        return np.concatenate(found)

    def _forget_segment_start(self, write: int, env: int, slot: int) -> list[np.ndarray]:
        """Start slot `slot` was reused: the rows of the segment that began at row `write`
        whose stacks needed it (at most its first k - 1 rows) become lost, and so do the
        rows before them whose n-step window bootstraps from one of those."""
        k, N, R, ring = self.k, self.num_envs, self.rows, self.ring

        def stored(w: int) -> bool:  # still in the buffer and not the row being written
            return ring.added + 1 - R < w < ring.added

        lost = [
            (w % R) * N + env
            for w in range(write, write + k - 1)
            if stored(w)
            and self._depth[w % R, env] < k - 1
            and self._start_slot[w % R, env] == slot
        ]
        if not lost:
            return []
        newly = [self._mark_lost(np.array(lost))]
        reach = self.n_step + 1 + len(ring.bridge_rows)  # bridges lengthen a window
        before = np.array([(w % R) * N + env for w in range(write - reach, write) if stored(w)])
        if len(before):
            ends = ring.windows(before, self.n_step, 1.0)[3]
            newly.append(self._mark_lost(before[np.isin(ends, lost)]))
        return newly

    def _mark_lost(self, flat: np.ndarray) -> np.ndarray:
        """Flat slots whose stacks can no longer be rebuilt: they stop being sampled.
        Returns those that were valid and not lost yet."""
        lost = self._lost.reshape(-1)
        flat = flat[self.ring.flat("valid")[flat] & ~lost[flat]]
        lost[flat] = True
        self.lost_count += len(flat)
        return flat

    def blocked(self) -> np.ndarray:
        """Per flat slot, whether it is lost (a view: samplers reject those slots)."""
        return self._lost.reshape(-1)

    def rewrite(self, row: int, following: int) -> None:
        """The ring is about to write `row` afresh and empty `following` (the new cursor
        row): neither is lost any more."""
        self._lost[row] = False
        self.lost_count -= np.count_nonzero(
            self.ring.host["valid"][following] & self._lost[following]
        )
        self._lost[following] = False

    def _write(self, where: slice, data: np.ndarray) -> None:
        if self._view is not None:
            self._view[where] = data
        else:
            copy_in(self.frames[where], torch.from_numpy(np.ascontiguousarray(data)))

    # -- reading ----------------------------------------------------------------------------

    def get(self, flat: np.ndarray) -> torch.Tensor:
        """The stacks of flat slots (any shape of indices), rebuilt from the frames."""
        N, k = self.num_envs, self.k
        row, env = np.divmod(flat, N)
        depth = self._depth.reshape(-1)[flat].astype(np.int64)[..., None]
        slot = self._start_slot.reshape(-1)[flat].astype(np.int64)[..., None]
        position = np.arange(k)  # oldest frame first
        back = (k - 1) - position  # rows above the slot's own
        from_rows = ((row[..., None] - back) % self.rows) * N + env[..., None]
        from_start = self.rows * N + slot * (k - 1) + np.minimum(position + depth, k - 2)
        index = np.where(back <= depth, from_rows, from_start)
        if self._view is not None:
            stacks = torch.from_numpy(self._view[index.reshape(-1)])
        else:
            stacks = self.frames[to_device(torch.from_numpy(index.reshape(-1)), self.device)]
        return stacks.view(*flat.shape, *self.obs_shape)

    # -- persistence ------------------------------------------------------------------------

    TENSORS = ("frames", "depth", "start_slot", "start_owner", "lost")

    def state_dict(self) -> dict[str, Any]:
        """The live tensors (not copies, as the buffer's own), and the start-ring count."""
        state: dict[str, Any] = {name: getattr(self, name).cpu() for name in self.TENSORS}
        return state | {"starts_written": self.starts_written}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() (after the ring's: lost slots are counted among its valid)."""
        load_tensors(self, self.TENSORS, state)
        self.starts_written = int(state["starts_written"])
        self.lost_count = int((self.ring.host["valid"] & self._lost).sum())
