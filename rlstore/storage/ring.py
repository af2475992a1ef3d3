"""The ring of a ReplayBuffer: its rows, the write cursor, the per-transition fields kept in
host memory, and the continuity of each env's stream of observations.

The ring has `rows` rows of `num_envs` slots (flat slot: row * num_envs + env). Each row
holds one vector step's actions, rewards and flags; its observations are kept apart (an
observation store), and the next observation of row i is the observation of row i + 1.
The row at the cursor holds the newest next_obs and no transition, so a capacity of C per
env takes C + 1 rows.

Flags per slot: `terminated`, `truncated`; `valid` (False for pseudo-steps, break rows and
the cursor row: not a transition); `bridge` (a break row whose env's stream goes on
through it: n-step windows step over it).

Stream continuity: each add's observation should be the previous add's next observation,
env by env. Where it is not (a manual or partial reset, SAME_STEP autoreset), or where the
client said so (`end_episodes`), the stream breaks and the buffer writes a break row.
Under NEXT_STEP autoreset the step after a done is a pseudo-step (`last_done`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstore.parts import Tree, leaves
from rlstore.storage.arrays import load_tensors, torch_dtype
from rlstore.storage.returns import n_step_windows

Fingerprint = tuple[tuple[np.dtype, bytes], ...]


def fingerprint(obs: Tree) -> Fingerprint:
    """Each part's (dtype, bytes): comparing bytes is much faster than np.array_equal."""
    if type(obs) is np.ndarray:
        return ((obs.dtype, obs.tobytes()),)
    return tuple((part.dtype, part.tobytes()) for part in leaves(obs))


def autoreset_mode_name(mode: str | gym.vector.AutoresetMode) -> str:
    """ "next_step" or "same_step" for a mode given by name or as Gymnasium's AutoresetMode
    (DISABLED, where the client resets envs itself, stores like SAME_STEP: no pseudo-steps)."""
    if isinstance(mode, gym.vector.AutoresetMode):
        return "next_step" if mode == gym.vector.AutoresetMode.NEXT_STEP else "same_step"
    if mode not in ("next_step", "same_step"):
        raise ValueError(f"autoreset_mode must be 'next_step' or 'same_step', got {mode!r}")
    return mode


class Ring:
    """`rows` rows of `num_envs` transition slots in host memory, the cursor and the count of
    transitions written (`added`), and each env's stream (see the module's docstring)."""

    FIELDS = ("actions", "rewards", "terminated", "truncated", "valid", "bridge")

    def __init__(
        self,
        rows: int,
        num_envs: int,
        action_shape: tuple[int, ...],
        action_dtype: torch.dtype,
        pseudo_steps: bool,
    ) -> None:
        R, N = rows, num_envs
        self.rows, self.num_envs, self.pseudo_steps = R, N, pseudo_steps
        self.actions = torch.zeros((R, N, *action_shape), dtype=action_dtype)
        self.rewards = torch.zeros((R, N))
        self.terminated = torch.zeros((R, N), dtype=torch.bool)
        self.truncated = torch.zeros((R, N), dtype=torch.bool)
        self.valid = torch.zeros((R, N), dtype=torch.bool)
        self.bridge = torch.zeros((R, N), dtype=torch.bool)
        # Written and read through numpy views (no torch call per field).
        self.host = {name: getattr(self, name).numpy() for name in self.FIELDS}
        self.cursor = 0  # the row the next add writes
        self.added = 0  # rows written in total
        self.count = 0  # valid slots
        self.bridge_rows: set[int] = set()  # rows with a bridge (rare): n-step checks them
        # The previous add's next_obs as fingerprint() gives it; None: unknown (fresh, or
        # just loaded).
        self.last_next_obs: Fingerprint | None = None
        self.last_done = np.zeros(N, dtype=bool)  # the next step is a pseudo-step
        self.ended = np.zeros(N, dtype=bool)  # told by end_episodes, until the next add

    @staticmethod
    def memory_bytes(slots: int, action_shape: tuple[int, ...], action_dtype: Any) -> int:
        """Host bytes of a ring of `slots` slots: action, float32 reward, four bool flags."""
        action = int(np.prod(action_shape, dtype=np.int64)) * torch_dtype(action_dtype).itemsize
        return slots * (action + 4 + 4)

    @property
    def following(self) -> int:
        """The row after the cursor's: where the next add's next_obs goes."""
        return (self.cursor + 1) % self.rows

    # -- streams ------------------------------------------------------------------------------

    def continues(self, obs: Tree, cursor_obs: Callable[[], list[np.ndarray]]) -> np.ndarray | None:
        """Per env, whether `obs` is the previous add's next_obs, every part of it, and no
        end_episodes came between (its stream goes on); None when every env's does (the usual
        case, told at once by comparing bytes). `cursor_obs`: the parts stored at the cursor
        row, read only when the previous next_obs is not known (just loaded)."""
        continues = self._same_as_before(obs, cursor_obs)
        if self.ended.any():  # (end_episodes: a new stream, whatever the data say)
            N = self.num_envs
            continues = (np.ones(N, dtype=bool) if continues is None else continues) & ~self.ended
            self.ended = np.zeros(N, dtype=bool)
        return continues

    def _same_as_before(
        self, obs: Tree, cursor_obs: Callable[[], list[np.ndarray]]
    ) -> np.ndarray | None:
        N = self.num_envs
        if self.added == 0:
            return np.zeros(N, dtype=bool)
        if self.last_next_obs is None:  # just loaded: compare with the stored row, as stored
            previous = cursor_obs()
            # (MuJoCo's float64 kept as float32)
            given = [
                o.astype(p.dtype, copy=False) for o, p in zip(leaves(obs), previous, strict=True)
            ]
        else:
            if fingerprint(obs) == self.last_next_obs:
                return None
            previous = [np.frombuffer(data, dtype=dtype) for dtype, data in self.last_next_obs]
            given = leaves(obs)
        continues = np.ones(N, dtype=bool)
        for before, now in zip(previous, given, strict=True):
            if before.dtype != now.dtype:
                return np.zeros(N, dtype=bool)
            continues &= (before.reshape(N, -1) == now.reshape(N, -1)).all(axis=1)
        return None if continues.all() else continues

    def streamed(self, next_obs: Tree, env_reset: np.ndarray) -> None:
        """After an add: its next_obs, and the envs whose next step is a pseudo-step."""
        self.last_next_obs = fingerprint(next_obs)
        self.last_done = env_reset

    # -- writing ------------------------------------------------------------------------------

    def write(self, action, reward, terminated, truncated, valid, bridge=None) -> None:
        """Fill the cursor row's transition fields (its obs is in place), empty the row after
        it (it becomes the cursor row: no transition there yet) and move the cursor on."""
        row, nxt, host = self.cursor, self.following, self.host
        host["actions"][row] = action
        host["rewards"][row] = reward
        host["terminated"][row] = terminated
        host["truncated"][row] = truncated
        host["valid"][row] = valid
        if self.bridge_rows:  # this row is rewritten, the next one becomes the cursor row
            for old in {row, nxt} & self.bridge_rows:
                host["bridge"][old] = False
                self.bridge_rows.discard(old)
        if bridge is not None and bridge.any():
            host["bridge"][row] = bridge
            self.bridge_rows.add(row)
        self.count += np.count_nonzero(valid) - np.count_nonzero(host["valid"][nxt])
        host["valid"][nxt] = False
        self.cursor = nxt
        self.added += 1

    def write_one(self, action, reward, terminated: bool, truncated: bool) -> None:
        """write() for a one-env ring whose stream goes on, from Python scalars (the lean
        DQN loop's add): the same state, without the batched bookkeeping."""
        host, row = self.host, self.cursor
        following = self.following
        valid = not self.last_done[0]  # the step after a done is a pseudo-step
        host["actions"][row, 0] = action
        host["rewards"][row, 0] = reward
        host["terminated"][row, 0] = terminated
        host["truncated"][row, 0] = truncated
        host["valid"][row, 0] = valid
        if self.bridge_rows:
            for old in {row, following} & self.bridge_rows:
                host["bridge"][old] = False
                self.bridge_rows.discard(old)
        self.count += valid - bool(host["valid"][following, 0])
        host["valid"][following, 0] = False
        self.cursor, self.added = following, self.added + 1
        self.last_next_obs = None  # (the next add() compares with the stored row)
        self.last_done[0] = (terminated or truncated) and self.pseudo_steps

    # -- reading ------------------------------------------------------------------------------

    def flat(self, name: str) -> np.ndarray:
        """A field over the flat slots (a view)."""
        return self.host[name].reshape(-1)

    def windows(self, index: np.ndarray, n: int, gamma: float) -> tuple[np.ndarray, ...]:
        """The n-step windows from flat slots `index` (storage/returns.py's n_step_windows)."""
        bridge = self.flat("bridge") if self.bridge_rows else None
        flags = (self.flat(name) for name in ("rewards", "valid", "terminated", "truncated"))
        return n_step_windows(index, *flags, bridge, self.num_envs, n, gamma)

    def written_at(self, flat: np.ndarray) -> np.ndarray:
        """The write number (`added` when it was written) of the newest row at flat slots."""
        row = flat // self.num_envs
        return self.added - 1 - (self.added - 1 - row) % self.rows

    def transition_ids(self, flat: np.ndarray) -> np.ndarray:
        """write * num_envs + env for flat slots: ids that tell a transition still stored from
        a newer one that has since taken its slot."""
        return self.written_at(flat) * self.num_envs + flat % self.num_envs

    def slots_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat slots, whether each transition is still stored) of transition ids."""
        write, env = np.divmod(ids, self.num_envs)
        flat = (write % self.rows) * self.num_envs + env
        # A row is rewritten `rows` writes later, and invalidated (as the cursor row) one before.
        return flat, (self.added - write < self.rows) & self.flat("valid")[flat]

    # -- persistence --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The live field tensors (not copies), the cursor and the streams."""
        state: dict[str, Any] = {name: getattr(self, name) for name in self.FIELDS}
        return state | {
            "cursor": self.cursor,
            "added": self.added,
            "last_done": torch.from_numpy(self.last_done.copy()),  # a life loss is no reset
            "ended": torch.from_numpy(self.ended.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_tensors(self, self.FIELDS, state)
        self.cursor, self.added = int(state["cursor"]), int(state["added"])
        self.last_next_obs = None
        self.last_done = state["last_done"].numpy().copy()
        self.ended = state["ended"].numpy().copy()
        self.count = int(self.host["valid"].sum())
        self.bridge_rows = set(np.flatnonzero(self.host["bridge"].any(axis=1)).tolist())
