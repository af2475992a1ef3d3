"""Replay buffers saved by an earlier rlstore, for the format tests (tests/test_replay_formats.py).

Each case builds a small buffer, fills it with a seeded stream that has every boundary the
buffer keeps (terminations, truncations, life losses, partial resets, end_episodes), and
says what it should sample. `python -m tests.replay_fixtures [CASE ...]` writes, per case,
tests/fixtures/replay/CASE.pt (buffer.save) and CASE.expected.pt (the two batches the
buffer sampled right after saving, around one more add), with the code of the tree it runs
in; the test loads the files into a buffer built by the code under test and checks that it
samples the same batches. Regenerate only to add a case: the point of the files is that an
older version of the code wrote them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from rlstore import ReplayBuffer
from rlstore.storage import Hindsight

FOLDER = Path(__file__).resolve().parent / "fixtures" / "replay"
GOAL = 3


def goal_reward(achieved, desired, info):
    return -(np.abs(achieved - desired).sum(-1) > 0.5).astype(np.float64)


CASES = {
    "uniform": dict(capacity=40, num_envs=2, obs_shape=(3,), n_step=1, seed=1),
    "per-n-step": dict(capacity=40, num_envs=2, obs_shape=(3,), n_step=3, prioritized=True, seed=2),
    "frames": dict(
        capacity=60,
        num_envs=2,
        obs_shape=(4, 5, 5),
        obs_dtype=np.uint8,
        n_step=3,
        frame_stack=4,
        start_capacity=8,
        seed=3,
    ),
    "hindsight": dict(
        capacity=50,
        num_envs=2,
        obs_shape={"achieved_goal": (GOAL,), "desired_goal": (GOAL,), "observation": (2,)},
        obs_dtype={
            "achieved_goal": np.float32,
            "desired_goal": np.float32,
            "observation": np.float32,
        },
        hindsight=Hindsight(goal_reward, goals=4, strategy="future"),
        seed=4,
    ),
    # a stream of terminations and truncations only: what files of format version 1 held
    "plain-n-step": dict(capacity=30, num_envs=2, obs_shape=(3,), n_step=3, seed=6, _plain=True),
    "dict-masks-same-step": dict(
        capacity=40,
        num_envs=3,
        obs_shape={"image": (2, 2), "position": ()},
        obs_dtype={"image": np.uint8, "position": np.int64},
        action_mask_shape=(4,),
        n_step=2,
        autoreset_mode="same_step",
        seed=5,
    ),
}


def _obs(case: dict, rng: np.random.Generator, counter: list[int]):
    """A fresh observation per env, unique (a counter) in its every part."""
    N, shape = case["num_envs"], case["obs_shape"]
    counter[0] += 1
    base = counter[0] * 10 + np.arange(N)
    if case.get("frame_stack"):
        return ((base[:, None, None, None] + np.arange(4)[:, None, None] * 0) % 251).astype(
            np.uint8
        ) * np.ones((N, *shape), np.uint8)
    if isinstance(shape, dict) and "image" in shape:
        return {
            "image": (base[:, None, None] % 251 * np.ones((N, 2, 2))).astype(np.uint8),
            "position": base.astype(np.int64),
        }
    if isinstance(shape, dict):
        return {
            "achieved_goal": rng.integers(0, 2, (N, GOAL)).astype(np.float32),
            "desired_goal": rng.integers(0, 2, (N, GOAL)).astype(np.float32),
            "observation": np.stack([base, base + 0.5], 1).astype(np.float32),
        }
    return np.stack([base, base + 0.25, -base], 1).astype(np.float32)


def _shift(frames: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Frame stacks after one step: the oldest frame out, `new`'s newest frame in."""
    return np.concatenate([frames[:, 1:], new[:, -1:]], axis=1)


def fill(buffer: ReplayBuffer, case: dict, steps: int, seed: int = 0) -> None:
    """`steps` vector steps of a seeded stream with every kind of boundary."""
    rng, counter, N = np.random.default_rng(seed), [0], buffer.num_envs
    same_step = case.get("autoreset_mode") == "same_step"
    obs = _obs(case, rng, counter)
    done = np.zeros(N, bool)
    plain = case.get("_plain", False)  # no manual resets, no end_episodes
    for step in range(steps):
        if step % 17 == 9 and not plain:  # a partial reset by hand: env 0's stream breaks
            fresh = _obs(case, rng, counter)
            obs = _take(obs, fresh, np.arange(N) == 0)
            done[0] = False
        if step % 23 == 11 and not plain:
            buffer.end_episodes(np.arange(N) == N - 1)
        new = _obs(case, rng, counter)
        next_obs = _shift(obs, new) if case.get("frame_stack") else new
        next_obs = _take(next_obs, new, done)  # a pseudo-step's next_obs: a reset observation
        kind = rng.random(N)
        terminated, truncated = (kind < 0.08) & ~done, (kind > 0.93) & ~done
        life_lost = (kind > 0.5) & (kind < 0.55) & ~done if case.get("frame_stack") else None
        reward = rng.normal(size=N).astype(np.float32)
        action = rng.integers(0, 4, N)
        extra = {}
        if "action_mask_shape" in case:
            extra = dict(
                action_mask=rng.random((N, 4)) < 0.7, next_action_mask=rng.random((N, 4)) < 0.7
            )
        buffer.add(obs, action, reward, next_obs, terminated, truncated, life_lost, **extra)
        ended = terminated | truncated
        if same_step and ended.any():  # SAME_STEP: the reset observation comes next
            next_obs = _take(next_obs, _obs(case, rng, counter), ended)
        obs, done = next_obs, ended & (not same_step)


def _take(old, new, where: np.ndarray):
    if isinstance(old, dict):
        return {key: _take(old[key], new[key], where) for key in old}
    mask = where.reshape(-1, *[1] * (old.ndim - 1))
    return np.where(mask, new, old)


def build(name: str) -> ReplayBuffer:
    return ReplayBuffer(**{k: v for k, v in CASES[name].items() if not k.startswith("_")})


def batches(buffer: ReplayBuffer, case: dict) -> dict:
    """What the checks compare: a batch sampled now, and one after one more add."""
    first = buffer.sample(16)._asdict()
    if buffer.prioritized:
        buffer.update_priorities(first["indices"], torch.arange(16, dtype=torch.float32))
    fill(buffer, case, 1, seed=99)
    second = buffer.sample(16)._asdict()
    return {"first": first, "second": second, "len": len(buffer)}


def write(names: list[str]) -> None:
    """Write the fixtures of cases `names` (none: every case)."""
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name, case in CASES.items():
        if names and name not in names:
            continue
        buffer = build(name)
        fill(buffer, case, 70)
        buffer.save(FOLDER / f"{name}.pt")
        torch.save(batches(buffer, case), FOLDER / f"{name}.expected.pt")
        print(f"wrote {name}: {len(buffer)} transitions")


if __name__ == "__main__":
    write(sys.argv[1:])
