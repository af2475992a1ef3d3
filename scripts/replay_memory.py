"""What a 1M-transition Atari replay buffer costs: bytes per transition, resident memory
once filled, sampling time, and the time and size of saving and loading it.

    python scripts/replay_memory.py                      # -> results/replay-memory.md
    python scripts/replay_memory.py --capacity 100000    # a quicker look

Fills ReplayBuffer(frame_stack=4) with a synthetic NEXT_STEP stream of 84x84 uint8 frames
(random pixels, games of 1,000 steps with zero-padded starts, a life lost every 200 steps),
as DQN on Atari fills it, then checks that stacks sampled after a save and load equal those
before. Not part of CI: it needs about 8 GB of memory and as much disk.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rlstore import ReplayBuffer
from rlstore.machine import machine_name

FRAME = (84, 84)
K = 4


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fill(buffer: ReplayBuffer, steps: int, game_length: int, rng: np.random.Generator) -> None:
    frames = rng.integers(0, 256, (4096, *FRAME), dtype=np.uint8)  # a pool to draw pixels from
    obs = np.zeros((1, K, *FRAME), dtype=np.uint8)
    obs[0, -1] = frames[0]
    pseudo = False
    for t in range(steps):
        next_obs = np.empty_like(obs)
        if pseudo:  # the step after a game over: the reset observation
            next_obs[0, :-1] = 0
        else:
            next_obs[0, :-1] = obs[0, 1:]
        next_obs[0, -1] = frames[(t * 7919) % len(frames)]
        game_over = not pseudo and (t + 1) % game_length == 0
        life_lost = not pseudo and not game_over and (t + 1) % 200 == 0
        buffer.add(obs, [t % 6], [1.0], next_obs, [game_over], [False], [life_lost])
        obs, pseudo = next_obs, game_over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--out", default="results/replay-memory.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)

    rss_before = resident_bytes()
    buffer = ReplayBuffer(args.capacity, 1, (K, *FRAME), obs_dtype=np.uint8, frame_stack=K, seed=0)
    stored = sum(getattr(buffer, name).nbytes for name in buffer._tensors)
    start = time.perf_counter()
    fill(buffer, args.capacity + 5_000, 1_000, rng)  # wrapped: every slot written
    fill_s = time.perf_counter() - start
    rss_filled = resident_bytes() - rss_before
    sample_ms = []
    for _ in range(200):
        start = time.perf_counter()
        buffer.sample(32)
        sample_ms.append((time.perf_counter() - start) * 1e3)
    before = buffer.sample(256)

    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = Path(tmp) / "replay.pt"
        start = time.perf_counter()
        buffer.save(path)
        save_s = time.perf_counter() - start
        file_bytes = path.stat().st_size
        del buffer
        restored = ReplayBuffer(
            args.capacity, 1, (K, *FRAME), obs_dtype=np.uint8, frame_stack=K, seed=0
        )
        start = time.perf_counter()
        restored.load(path)
        load_s = time.perf_counter() - start
    restored.generator = np.random.default_rng(0)  # the same draws as `before` took
    for _ in range(200):
        restored.sample(32)
    after = restored.sample(256)
    same = torch.equal(before.obs, after.obs) and torch.equal(before.next_obs, after.next_obs)

    per = stored / args.capacity
    lines = [
        f"# Replay memory: a {args.capacity:,}-transition Atari buffer",
        "",
        f"`python scripts/replay_memory.py --capacity {args.capacity}` on {machine_name()}, "
        f"{time.strftime('%Y-%m-%d')}. ReplayBuffer(frame_stack=4) with 84x84 uint8 frames, "
        "filled by a synthetic DQN stream (games of 1,000 steps, a life lost every 200).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| bytes per transition (all tensors / capacity) | {per:,.0f} |",
        f"| of which frames (one 84x84 frame = 7,056 bytes) | "
        f"{buffer_frames_per(args.capacity):,.0f} |",
        f"| whole stacks twice (obs and next_obs, the naive layout) | {2 * K * 7056:,} |",
        f"| tensors of the buffer | {stored / 2**30:.2f} GiB |",
        f"| resident memory added by the filled buffer | {rss_filled / 2**30:.2f} GiB |",
        f"| fill time ({args.capacity + 5_000:,} adds) | {fill_s:.0f} s |",
        f"| sample(32), median of 200 | {statistics.median(sample_ms):.2f} ms |",
        f"| checkpoint file | {file_bytes / 2**30:.2f} GiB |",
        f"| save (atomic: temporary file, fsync, rename) | {save_s:.1f} s |",
        f"| load | {load_s:.1f} s |",
        f"| stacks sampled after save and load equal those before | {same} |",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    if not same:
        raise SystemExit("restored buffer differs")


def buffer_frames_per(capacity: int) -> float:
    probe = ReplayBuffer(capacity, 1, (K, *FRAME), obs_dtype=np.uint8, frame_stack=K)
    return probe.stacks.frames.nbytes / capacity


if __name__ == "__main__":
    main()
