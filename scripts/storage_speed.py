"""The storages' own speed, per call, for a change to compare before and after: the replay
buffer's add and sample in the shapes rlstore's runs use (CartPole DQN, prioritized n-step,
a Dict observation with action masks, Atari frame stacks, hindsight on goals) and the
rollout storage's insert.

    python scripts/storage_speed.py                   # this tree
    python scripts/storage_speed.py --against 8fbaa79 # that commit and this tree, alternating

Median microseconds per call of 5 repeats, one torch thread; with --against, each tree runs
in its own process, three times, alternating, and the table gives the medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def per_call_us(fn, n: int) -> float:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def measures() -> dict[str, float]:
    """Each case's microseconds per call, with the rlstore on sys.path."""
    import numpy as np
    import torch

    from rlstore import ReplayBuffer, RolloutStorage
    from rlstore.storage import Hindsight

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    out = {}

    def stream(buffer, n, obs_of, extra=lambda: {}):
        """Fill `buffer` with n steps; return a function that adds one more."""
        N = buffer.num_envs
        state = {"obs": obs_of()}

        def add():
            nxt = obs_of()
            done = rng.random(N) < 0.02
            buffer.add(state["obs"], np.zeros(N, np.int64), np.ones(N, np.float32), nxt, done,
                       np.zeros(N, bool), **extra())  # fmt: skip
            state["obs"] = nxt

        for _ in range(n):
            add()
        return add

    flat = ReplayBuffer(10_000, 1, (4,), seed=0)
    add = stream(flat, 2000, lambda: rng.random((1, 4), np.float32))
    out["replay add, CartPole DQN (1 env)"] = per_call_us(add, 1000)
    out["replay sample(128), CartPole DQN"] = per_call_us(lambda: flat.sample(128), 200)
    out["replay sample_host(128), CartPole DQN"] = per_call_us(lambda: flat.sample_host(128), 200)
    per = ReplayBuffer(50_000, 4, (8,), n_step=3, prioritized=True, seed=0)
    add = stream(per, 3000, lambda: rng.random((4, 8), np.float32))
    out["replay add, prioritized 3-step (4 envs)"] = per_call_us(add, 1000)
    out["replay sample(32), prioritized 3-step"] = per_call_us(lambda: per.sample(32), 200)
    shapes = {"image": (7, 7, 3), "direction": ()}
    dtypes = {"image": np.uint8, "direction": np.int64}
    masked = ReplayBuffer(10_000, 4, shapes, dtypes, action_mask_shape=(6,), seed=0)
    add = stream(
        masked,
        2000,
        lambda: {
            "image": rng.integers(0, 9, (4, 7, 7, 3), np.uint8),
            "direction": rng.integers(0, 4, 4),
        },  # fmt: skip
        lambda: {
            "action_mask": rng.random((4, 6)) < 0.8,
            "next_action_mask": rng.random((4, 6)) < 0.8,
        },
    )
    out["replay add, Dict + masks (4 envs)"] = per_call_us(add, 1000)
    out["replay sample(128), Dict + masks"] = per_call_us(lambda: masked.sample(128), 200)
    frames = ReplayBuffer(20_000, 4, (4, 84, 84), np.uint8, frame_stack=4, n_step=3, seed=0)
    stacks = {"obs": rng.integers(0, 255, (4, 4, 84, 84), np.uint8)}

    def frame_obs():
        new = rng.integers(0, 255, (4, 1, 84, 84), np.uint8)
        stacks["obs"] = np.concatenate([stacks["obs"][:, 1:], new], axis=1)
        return stacks["obs"]

    add = stream(frames, 1000, frame_obs)
    out["replay add, Atari frame stacks (4 envs)"] = per_call_us(add, 200)
    out["replay sample(32), Atari frame stacks"] = per_call_us(lambda: frames.sample(32), 100)
    goals = {"observation": (10,), "achieved_goal": (3,), "desired_goal": (3,)}
    her = ReplayBuffer(
        10_000, 2, goals, dict.fromkeys(goals, np.float32), seed=0,
        hindsight=Hindsight(lambda a, d, info: (np.abs(a - d).sum(-1) > 0.05) * -1.0),
    )  # fmt: skip
    stream(her, 2000, lambda: {k: rng.random((2, *s), np.float32) for k, s in goals.items()})
    out["replay sample(256), hindsight"] = per_call_us(lambda: her.sample(256), 100)
    storage = RolloutStorage(128, 8, (4,))
    storage.reset(np.zeros((8, 4), np.float32))
    zeros, no = np.zeros(8, np.float32), np.zeros(8, bool)
    step = (rng.random((8, 4), np.float32), np.zeros(8, np.int64), zeros, zeros, zeros + 1, no, no)

    def insert():
        if storage.step == storage.num_steps:
            storage.after_update()
        storage.insert(*step)

    out["rollout insert, CartPole PPO (8 envs)"] = per_call_us(insert, 5000)
    return out


def child() -> None:
    print("RESULT " + json.dumps(measures()), flush=True)


def run_tree(tree: Path) -> dict[str, float]:
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
        f"repr(f).lower()]; sys.path.insert(0, {str(tree)!r}); "
        f"sys.argv = ['x', '--child']; "
        f"exec(open({__file__!r}).read(), {{'__name__': '__main__', '__file__': {__file__!r}}})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(proc.stderr[-3000:])


def main() -> None:
    if "--child" in sys.argv:
        child()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a commit to compare this tree with")
    args = parser.parse_args()
    if not args.against:
        for name, us in run_tree(ROOT).items():
            print(f"| {name} | {us:,.1f} |")
        return
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before_tree), args.against],
            check=True,
            capture_output=True,
        )
        try:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for _ in range(3):
                runs["before"].append(run_tree(before_tree))
                runs["after"].append(run_tree(ROOT))
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)],
                check=True,
            )
    print(f"| per call, us (median of 3 processes) | {args.against} | this tree | ratio |")
    print("|---|---|---|---|")
    for name in runs["before"][0]:
        before = statistics.median(r[name] for r in runs["before"])
        after = statistics.median(r[name] for r in runs["after"])
        print(f"| {name} | {before:,.1f} | {after:,.1f} | x{before / after:.2f} |")


if __name__ == "__main__":
    main()
