"""Files written by earlier versions of rlstore, brought to today's format in one place: each
saved state carries its format's version, and a state of an older version is migrated step
by step before the class that loads it sees it. The classes then read one format only.

Replay buffers (REPLAY_FORMAT; a state without `format_version` is version 1):
    1 -> 2  keys that version 1 files written before a feature lack: `autoreset_mode` (all
            NEXT_STEP then), `bridge` (no break rows went on), `last_done` (a done at the
            newest row meant a reset: life losses were not kept apart), `ended` (no
            end_episodes pending).
Rollout storages (ROLLOUT_FORMAT):
    1 -> 2  `life_lost` (no lives then) and `episode_starts` (read by recurrent policies
            only; every step a start is what they assumed).
Checkpoints ("rlstore-checkpoint-1" -> "-2"): the episode statistics moved out of the
algorithm's state; the lean vector env's attributes were saved under SyncVectorEnv's
names.
"""

from __future__ import annotations

from typing import Any

import torch

REPLAY_FORMAT = 2
ROLLOUT_FORMAT = 2


def _version(state: dict[str, Any], newest: int, what: str) -> int:
    """A saved state's format version (1 before versions were kept); a ValueError for one
    newer than this rlstore reads."""
    version = int(state.get("format_version", 1))
    if version > newest:
        raise ValueError(
            f"the {what} was saved by a newer rlstore (format {version}; this one reads up "
            f"to {newest}): upgrade rlstore"
        )
    return version


def replay_state(state: dict[str, Any]) -> dict[str, Any]:
    """A ReplayBuffer's saved state in REPLAY_FORMAT."""
    if _version(state, REPLAY_FORMAT, "replay buffer") == 1:
        cursor, valid = int(state["cursor"]), state["valid"]
        newest = (cursor - 1) % valid.shape[0]
        state = {
            "autoreset_mode": "next_step",
            "bridge": torch.zeros_like(valid),
            "last_done": state["terminated"][newest] | state["truncated"][newest],
            "ended": torch.zeros(valid.shape[1], dtype=torch.bool),
            **state,
            "format_version": 2,
        }
    return state


def rollout_state(state: dict[str, Any]) -> dict[str, Any]:
    """A RolloutStorage's saved state in ROLLOUT_FORMAT."""
    if _version(state, ROLLOUT_FORMAT, "rollout storage") == 1:
        steps, num_envs = state["valid"].shape
        state = {
            "life_lost": torch.zeros((steps, num_envs), dtype=torch.bool),
            "episode_starts": torch.ones((steps + 1, num_envs), dtype=torch.bool),
            **state,
            "format_version": 2,
        }
    return state


# The lean vector env's attributes in a format-1 checkpoint, saved when it was a
# SyncVectorEnv subclass, under SyncVectorEnv's names.
_LEAN_ENV_FORMAT_1_NAMES = {
    f"_{name}": name for name in ("observations", "rewards", "terminations", "truncations")
} | {"_autoreset_envs": "autoreset"}


def lean_env_state(saved: dict[str, Any]) -> dict[str, Any]:
    """The lean vector env's saved attributes under today's names."""
    return {_LEAN_ENV_FORMAT_1_NAMES.get(k, k): v for k, v in saved.items() if k != "_env_obs"}


def checkpoint_state(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's fields in today's format (format 1 kept the episode statistics in the
    algorithm's state)."""
    if "episode_stats" not in state:  # format 1
        state["episode_stats"] = state["algorithm"].pop("stats")
    return state
