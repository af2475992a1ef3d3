"""rlstore against SB3 on the spaces of the user's own environment, side by side in one
command, as users run them (each run its own process, default options and threads):

    pip install -e ".[bench,minigrid]"
    python scripts/benchmark_spaces.py                   # both rows, 1 and 2 runs at once
    python scripts/benchmark_spaces.py --rows taxi --steps 50000 --parallel 1

Rows (PPO at rlstore's defaults on both sides: 4 envs x 128 steps, 4 epochs of 4
minibatches, lr 2.5e-4, clip 0.2, 64-64 tanh actor and critic, Adam eps 1e-5):
- taxi: Taxi-v4 (Discrete(500) observations, one-hot on both sides) under its action masks:
  `rlstore train ppo --env Taxi-v4` (masks read from info["action_mask"]) against
  sb3-contrib's MaskablePPO with an ActionMasker giving Taxi's own action_mask.
- minigrid: MiniGrid-DoorKey-5x5-v0 on its Dict observation less the text mission
  (`--drop-obs-keys mission`): rlstore's small CNN on the 7x7x3 image and a one-hot
  direction, against SB3's PPO with MultiInputPolicy. SB3's CombinedExtractor puts images
  through its Nature CNN, which a 7x7 image is too small for; the image goes to SB3 as
  float32, which its extractor flattens (its way to run this env without writing a
  feature extractor): a smaller network than rlstore's CNN.
- minigrid-flat: the same env with the same network on both sides: rlstore is given the
  image as float32 too (`--wrapper benchmark_spaces:image_as_floats`), which it flattens
  as SB3 does, beside the same SB3 run as the minigrid row.

For each K of --parallel, K copies of each trainer's run go at once (seeds 1..K), and the
aggregate env steps/s (the sum of the copies' own, from their launch to their end, imports
and start-up included) is reported with the ratio rlstore / SB3. Writes
results/benchmark-spaces.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = {
    "taxi": {"env": "Taxi-v4", "rlstore": []},
    "minigrid": {"env": "MiniGrid-DoorKey-5x5-v0", "rlstore": ["--drop-obs-keys", "mission"]},
    "minigrid-flat": {
        "env": "MiniGrid-DoorKey-5x5-v0",
        "rlstore": ["--drop-obs-keys", "mission", "--wrapper", "benchmark_spaces:image_as_floats"],
    },
}


def image_as_floats(env):
    """MiniGrid's uint8 image part as float32 (a flat Box to either trainer), the other
    parts as they are."""
    import gymnasium as gym

    image = env.observation_space["image"]
    space = gym.spaces.Dict(
        {**env.observation_space.spaces, "image": gym.spaces.Box(0, 255, image.shape, "float32")}
    )
    return gym.wrappers.TransformObservation(
        env, lambda o: {**o, "image": o["image"].astype("float32")}, space
    )


def sb3_run(row: str, steps: int, seed: int) -> None:
    """SB3's side of a row, at rlstore's PPO defaults (the module docstring)."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.env_util import make_vec_env

    kwargs = dict(
        n_steps=128,
        batch_size=128,
        n_epochs=4,
        learning_rate=2.5e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        verbose=0,
        device="cpu",
        policy_kwargs=dict(
            net_arch=dict(pi=[64, 64], vf=[64, 64]),
            activation_fn=torch.nn.Tanh,
            optimizer_kwargs=dict(eps=1e-5),
        ),
    )
    if row == "taxi":
        from sb3_contrib import MaskablePPO
        from sb3_contrib.common.wrappers import ActionMasker

        def masked(env: gym.Env) -> gym.Env:
            return ActionMasker(env, lambda e: e.unwrapped.action_mask(e.unwrapped.s))

        envs = make_vec_env("Taxi-v4", n_envs=4, seed=seed, wrapper_class=masked)
        MaskablePPO("MlpPolicy", envs, **kwargs).learn(steps)
        return
    import minigrid  # noqa: F401 (registers its ids)
    from stable_baselines3 import PPO

    def dict_without_mission(env: gym.Env) -> gym.Env:
        return image_as_floats(gym.wrappers.FilterObservation(env, ["direction", "image"]))

    envs = make_vec_env(ROWS[row]["env"], n_envs=4, seed=seed, wrapper_class=dict_without_mission)
    PPO("MultiInputPolicy", envs, **kwargs).learn(steps)


def env_ceiling(env_id: str = "MiniGrid-DoorKey-5x5-v0", steps: int = 20_000) -> dict:
    """What the env alone steps per second under random actions, with no trainer: one bare
    env (unwrapped), and 4 of them (the rows' count) in Gymnasium's SyncVectorEnv without
    the mission: the most any trainer's run on it can make."""
    import gymnasium as gym
    import minigrid  # noqa: F401 (registers its ids)
    import numpy as np

    rng = np.random.default_rng(0)
    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    start = time.perf_counter()
    for action in rng.integers(0, 7, steps):
        if any(env.step(action)[2:4]):
            env.reset()
    bare = steps / (time.perf_counter() - start)

    def make() -> gym.Env:
        return gym.wrappers.FilterObservation(gym.make(env_id), ["direction", "image"])

    envs = gym.vector.SyncVectorEnv([make] * 4)
    envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps // 4):
        envs.step(rng.integers(0, 7, 4))
    vector = steps / (time.perf_counter() - start)
    return {"env": env_id, "bare_env_sps": bare, "sync_vector_4_sps": vector}


def launch(trainer: str, row: str, steps: int, seed: int) -> subprocess.Popen:
    if trainer == "rlstore":
        logdir = str(ROOT / "runs" / "bench-spaces")
        command = [
            "rlstore",
            "train",
            "ppo",
            "--env",
            ROWS[row]["env"],
            *ROWS[row]["rlstore"],
            "--total-timesteps",
            str(steps),
            "--seed",
            str(seed),
            "--no-progress",
            "--checkpoint-every",
            "0",
            "--logdir",
            logdir,
        ]
    else:
        command = [sys.executable, __file__, "--sb3-child", row, str(steps), str(seed)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")])
        ),
    }
    return subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )


def side_by_side(trainer: str, row: str, steps: int, k: int) -> dict:
    """K copies at once; each one's steps/s from its launch to its end."""
    start = time.perf_counter()
    procs = [launch(trainer, row, steps, seed) for seed in range(1, k + 1)]
    ends = []
    for proc in procs:
        err = proc.communicate()[1]
        if proc.returncode:
            raise SystemExit(f"{trainer} {row} failed:\n{err[-2000:]}")
        ends.append(time.perf_counter() - start)
    return {
        "trainer": trainer,
        "row": row,
        "k": k,
        "steps": steps,
        "seconds": ends,
        "sps": sum(steps / t for t in ends),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--steps", type=int, default=40_960)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmark-spaces"))
    parser.add_argument("--sb3-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument(
        "--env-ceiling", action="store_true", help="only time MiniGrid's env alone, no trainer"
    )
    args = parser.parse_args()
    if args.env_ceiling:
        print(json.dumps(env_ceiling()))
        return
    if args.sb3_child:
        row, steps, seed = args.sb3_child
        sb3_run(row, int(steps), int(seed))
        return
    results = []
    for row in args.rows:
        for k in args.parallel:
            for trainer in ("rlstore", "sb3"):  # alternating, the same machine state
                results.append(side_by_side(trainer, row, args.steps, k))
                print(json.dumps(results[-1]), flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    from rlstore.machine import machine_name  # (here: importing rlstore sets OMP_WAIT_POLICY)

    machine = f"{os.cpu_count()}-core {machine_name()}, {time.strftime('%Y-%m-%d')}"
    lines = [
        "# Spaces benchmark: rlstore vs SB3 (scripts/benchmark_spaces.py)",
        "",
        f"`python scripts/benchmark_spaces.py --steps {args.steps} --parallel "
        f"{' '.join(map(str, args.parallel))}` on this {machine}, commit {commit}; PPO, "
        "default options and threads; aggregate env steps/s of K runs at once, launch "
        "to end (the module docstring says what each side runs).",
        "",
        "| row | K | rlstore steps/s | SB3 steps/s | rlstore / SB3 |",
        "|---|---|---|---|---|",
    ]
    for row in args.rows:
        for k in args.parallel:
            mine, theirs = (
                next(r for r in results if r["row"] == row and r["k"] == k and r["trainer"] == t)
                for t in ("rlstore", "sb3")
            )
            ratio = mine["sps"] / theirs["sps"]
            lines.append(
                f"| {row} ({ROWS[row]['env']}) | {k} | {mine['sps']:,.0f} | "
                f"{theirs['sps']:,.0f} | {ratio:.1f}x |"
            )
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
