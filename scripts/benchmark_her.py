"""Hindsight replay's speed beside SB3's HerReplayBuffer, side by side in one command
(issue 59):

    pip install -e ".[bench,robotics]"
    python scripts/benchmark_her.py sampling           # batches of 256 and 1,024, full buffer
    python scripts/benchmark_her.py runs --steps 20000 # whole FetchReach-v4 SAC + HER runs
    python scripts/benchmark_her.py runs --profile     # and then where the time goes

sampling: both buffers hold the same 100,000 transitions, then 1,000,000 (RL Zoo's
FetchReach buffer; SB3's sampling scans its whole episode-length array, so its cost grows
with the buffer's size) (FetchReach's shapes: a 10-number
observation, 3-number goals, 4-number actions; episodes of 50 steps, one env) and relabel
with future goals, 4 per real one, rewards by FetchReach's own compute_reward (one vectorized
call per batch on both sides). Per batch size: the median over 5 repeats of the mean time
of 200 `sample` calls (tensors on the CPU on both sides).

runs: `rlstore train sac --env FetchReach-v4 --her` and SB3's SAC with HerReplayBuffer at
RL Zoo's FetchReach settings (gamma 0.95, lr 1e-3, batch 256, learning from step 1,000,
64-64 networks, automatic entropy, future goals x 4), each its own process at default
threads, one after the other (wall time from launch, imports included); with --profile,
then where the time goes, from cProfile over a run of each (env steps, storing, sampling with its
relabelling, gradient steps). Writes results/benchmark-her.md and .json (the part run
replaces its own section).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "benchmark-her"
CAPACITIES, EPISODE = (100_000, 1_000_000), 50
SETTINGS = dict(
    gamma=0.95, learning_rate=1e-3, batch_size=256, learning_starts=1000, hidden=[64, 64]
)


def fetch_env() -> gym.Env:
    import gymnasium_robotics

    gym.register_envs(gymnasium_robotics)
    return gym.make("FetchReach-v4")


def stream(rng: np.random.Generator):
    """Episodes of FetchReach-shaped transitions: (obs, action, reward, next_obs, done),
    each step's obs the previous step's next_obs."""
    while True:
        achieved = rng.normal(size=3).astype(np.float32)
        desired = rng.normal(size=3).astype(np.float32)
        next_obs = {
            "observation": rng.normal(size=10).astype(np.float32),
            "achieved_goal": achieved,
            "desired_goal": desired,
        }
        for t in range(EPISODE):
            obs = next_obs
            achieved = (achieved + 0.05 * rng.normal(size=3)).astype(np.float32)
            next_obs = {
                "observation": rng.normal(size=10).astype(np.float32),
                "achieved_goal": achieved,
                "desired_goal": desired,
            }
            action = rng.uniform(-1, 1, 4).astype(np.float32)
            yield obs, action, -1.0, next_obs, t == EPISODE - 1


def timed(sample, batch: int) -> float:
    """The median over 5 repeats of the mean seconds of 200 calls."""
    sample(batch)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            sample(batch)
        times.append((time.perf_counter() - start) / 200)
    return float(np.median(times))


def sampling() -> dict:
    """Per buffer size and batch size: SB3's and rlstore's ms per batch, and the ratio."""
    result = {}
    for capacity in CAPACITIES:
        sb3, ours = filled_buffers(capacity)
        for batch in (256, 1024):
            theirs, mine = timed(sb3.sample, batch), timed(ours.sample, batch)
            result[f"{capacity}/{batch}"] = {
                "capacity": capacity,
                "batch": batch,
                "sb3_ms": theirs * 1e3,
                "rlstore_ms": mine * 1e3,
                "ratio": theirs / mine,
            }
            print(
                f"buffer {capacity:,}, batch {batch}: SB3 {theirs * 1e3:.3f} ms, rlstore "
                f"{mine * 1e3:.3f} ms, {theirs / mine:.1f}x",
                flush=True,
            )
        del sb3, ours
    return result


def filled_buffers(capacity: int) -> tuple:
    """SB3's HerReplayBuffer and rlstore's ReplayBuffer, full of the same transitions."""
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlstore import Hindsight, ReplayBuffer

    env = fetch_env()
    vec = DummyVecEnv([fetch_env])
    sb3 = HerReplayBuffer(
        capacity,
        vec.observation_space,
        vec.action_space,
        vec,
        device="cpu",
        n_sampled_goal=4,
        goal_selection_strategy="future",
    )
    shapes = {key: space.shape for key, space in env.observation_space.spaces.items()}
    hindsight = Hindsight(env.unwrapped.compute_reward, None, 4, "future")
    ours = ReplayBuffer(
        capacity,
        1,
        shapes,
        dict.fromkeys(shapes, np.float32),
        action_shape=(4,),
        action_dtype=np.float32,
        seed=0,
        hindsight=hindsight,
    )
    one = lambda x: np.asarray(x)[None]  # noqa: E731 (a batch of one env)
    transitions = stream(np.random.default_rng(0))
    for _ in range(capacity):
        obs, action, reward, next_obs, done = next(transitions)
        obs1 = {k: one(v) for k, v in obs.items()}
        next1 = {k: one(v) for k, v in next_obs.items()}
        sb3.add(obs1, next1, one(action), one(reward), one(done), [{"TimeLimit.truncated": done}])
        ours.add(obs1, one(action), one(reward), next1, one(False), one(done))
    return sb3, ours


def sb3_run(steps: int, seed: int) -> None:
    from stable_baselines3 import SAC, HerReplayBuffer

    model = SAC(
        "MultiInputPolicy",
        fetch_env(),
        learning_rate=SETTINGS["learning_rate"],
        buffer_size=1_000_000,
        learning_starts=SETTINGS["learning_starts"],
        batch_size=SETTINGS["batch_size"],
        tau=0.005,
        gamma=SETTINGS["gamma"],
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        policy_kwargs=dict(net_arch=SETTINGS["hidden"]),
        seed=seed,
        device="cpu",
    )
    model.learn(steps)


def rlstore_args(steps: int, seed: int, logdir: str) -> list[str]:
    return [
        "train",
        "sac",
        "--env",
        "FetchReach-v4",
        "--her",
        "--total-timesteps",
        str(steps),
        "--seed",
        str(seed),
        "--gamma",
        str(SETTINGS["gamma"]),
        "--policy-lr",
        "1e-3",
        "--q-lr",
        "1e-3",
        "--batch-size",
        str(SETTINGS["batch_size"]),
        "--learning-starts",
        str(SETTINGS["learning_starts"]),
        "--hidden",
        *map(str, SETTINGS["hidden"]),
        "--logdir",
        logdir,
        "--no-progress",
    ]


def profile_shares(call, groups: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """The share of `call`'s time in each group of functions (cumulative, by name)."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(call)
    total = time.perf_counter() - start
    cumulative: dict[str, float] = {}  # "file stem:function" -> cumulative seconds
    for (path, _, name), row in pstats.Stats(profiler).stats.items():
        key = f"{Path(path).stem}:{name}"
        cumulative[key] = cumulative.get(key, 0.0) + row[3]
    shares = {
        group: sum(cumulative.get(name, 0.0) for name in names) / total
        for group, names in groups.items()
    }
    shares["total_s"] = total
    return shares


def runs(steps: int, profile: bool) -> dict:
    logdir = "/tmp/rlstore-benchmark-her"
    walls = {}
    for trainer in ("rlstore", "sb3"):
        command = [sys.executable, "-m", "rlstore", *rlstore_args(steps, 1, logdir)]
        if trainer == "sb3":
            command = [sys.executable, __file__, "sb3-run", "--steps", str(steps)]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        walls[trainer] = time.perf_counter() - start
        print(f"{trainer}: {steps:,} steps in {walls[trainer]:.1f} s", flush=True)
    result = {"steps": steps, "wall_s": walls, "ratio": walls["sb3"] / walls["rlstore"]}
    if not profile:
        return result
    from rlstore.algos import sac
    from rlstore.algos.sac import SACConfig

    short = min(steps, 5000)
    cfg = SACConfig(
        env_id="FetchReach-v4",
        her=True,
        total_timesteps=short,
        gamma=0.95,
        policy_lr=1e-3,
        q_lr=1e-3,
        learning_starts=1000,
        hidden=(64, 64),
        logdir=logdir,
        progress=False,
    )
    ours = profile_shares(
        lambda: sac.train(cfg),
        {
            "env steps": ("sync_vector_env:step",),
            "storing": ("replay:add",),
            "sampling (relabelling included)": ("replay:sample",),
            "relabelling alone": ("replay:_relabel",),
            "gradient steps": ("sac:gradient_step",),
        },
    )
    theirs = profile_shares(
        lambda: sb3_run(short, 1),
        {
            "env steps": ("dummy_vec_env:step_wait",),
            "storing": ("her_replay_buffer:add",),
            "sampling (relabelling included)": ("her_replay_buffer:sample",),
            "relabelling alone": ("her_replay_buffer:_get_virtual_samples",),
            "gradient steps": ("sac:train",),
        },
    )
    return result | {"profile_steps": short, "profile": {"rlstore": ours, "sb3": theirs}}


def markdown(results: dict) -> str:
    lines = [
        "# HER speed: rlstore beside SB3's HerReplayBuffer (scripts/benchmark_her.py)",
        "",
        f"On {results['machine']}, at commit {results['commit']}.",
        "",
    ]
    if "sampling" in results:
        lines += [
            "## Sampling a batch from a full buffer",
            "",
            "`python scripts/benchmark_her.py sampling`: full buffers of FetchReach-"
            "shaped transitions, future goals x 4, FetchReach's compute_reward; the "
            "median of 5 repeats of 200 calls.",
            "",
            "| buffer | batch | SB3 HerReplayBuffer ms | rlstore ms | rlstore's speed-up |",
            "|---|---|---|---|---|",
        ]
        for r in results["sampling"].values():
            lines.append(
                f"| {r['capacity']:,} | {r['batch']:,} | {r['sb3_ms']:.3f} | "
                f"{r['rlstore_ms']:.3f} | {r['ratio']:.1f}x |"
            )
        lines.append("")
    if "runs" in results:
        r = results["runs"]
        lines += [
            "## Whole FetchReach-v4 runs, SAC + HER",
            "",
            f"`python scripts/benchmark_her.py runs --steps {r['steps']}`: one run "
            "each, alone, default threads, wall time from launch (imports included).",
            "",
            "| trainer | wall s | steps/s |",
            "|---|---|---|",
            f"| SB3 SAC + HerReplayBuffer | {r['wall_s']['sb3']:.1f} | "
            f"{r['steps'] / r['wall_s']['sb3']:,.0f} |",
            f"| rlstore sac --her | {r['wall_s']['rlstore']:.1f} | "
            f"{r['steps'] / r['wall_s']['rlstore']:,.0f} |",
            "",
            f"rlstore / SB3 speed: {r['ratio']:.2f}x.",
            "",
        ]
        if "profile" in r:
            lines += [
                f"Where the time goes (cProfile, {r['profile_steps']:,} steps each, "
                "shares of the run's time; the profiler slows Python calls, so shares, "
                "not seconds):",
                "",
                "| part | rlstore | SB3 |",
                "|---|---|---|",
            ]
            ours, theirs = r["profile"]["rlstore"], r["profile"]["sb3"]
            for part in ours:
                if part != "total_s":
                    lines.append(f"| {part} | {ours[part]:.0%} | {theirs[part]:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=["sampling", "runs", "sb3-run"])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--profile", action="store_true", help="runs: then cProfile each")
    args = parser.parse_args()
    if args.part == "sb3-run":
        sb3_run(args.steps, 1)
        return
    results = (
        json.loads(OUT.with_suffix(".json").read_text())
        if OUT.with_suffix(".json").exists()
        else {}
    )
    results[args.part] = sampling() if args.part == "sampling" else runs(args.steps, args.profile)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    from rlstore.machine import machine_name  # (here: importing rlstore sets OMP_WAIT_POLICY)

    results["machine"] = f"{machine_name()}, {os.cpu_count()} cores"
    results["commit"] = commit
    OUT.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    OUT.with_suffix(".md").write_text(markdown(results))


if __name__ == "__main__":
    main()
