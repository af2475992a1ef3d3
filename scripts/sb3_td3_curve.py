"""stable-baselines3's TD3 at CleanRL's td3_continuous_action.py settings, for a learning
curve to set beside rlstore's on the same env, MuJoCo version and machine (needs
rlstore[bench]; MuJoCo envs need rlstore[mujoco]).

    python scripts/sb3_td3_curve.py Walker2d-v4 --seed 1 --steps 300000 --out sb3.jsonl
    python scripts/sb3_td3_curve.py --summary sb3.jsonl        # 25k-step windows

Writes one JSON line per finished episode (env step, return, length). SB3's TD3 step equals
rlstore's from the same weights, batches and draws (tests/test_sac_td3.py), so what such a
curve can tell apart is the rest: collection, the replay buffer, seeds.

With --checkpoint-every N the model, its optimizers and the replay buffer are saved every N
steps in OUT.checkpoints/, and the same command continues from the newest one: a 1M-step
run takes hours. A continued run starts a fresh episode (SB3 saves no env state) and
reseeds, so it is not the run an uninterrupted one makes.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np


def train(
    env_id: str,
    seed: int,
    steps: int,
    out: Path,
    checkpoint_every: int = 0,
    learning_starts: int = 25_000,
) -> None:
    import gymnasium as gym
    import torch
    from stable_baselines3 import TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(1)  # as rlstore's runs

    class Episodes(BaseCallback):
        def __init__(self, file) -> None:
            super().__init__()
            self.file = file

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    row = {
                        "step": self.num_timesteps,
                        "return": float(info["episode"]["r"]),
                        "length": int(info["episode"]["l"]),
                    }
                    self.file.write(json.dumps(row) + "\n")
                    self.file.flush()
            return True

        def _on_rollout_start(self) -> None:
            # here the last step is stored and trained on (train_freq 1): a clean cut
            step = self.num_timesteps
            if checkpoint_every and step % checkpoint_every == 0 and step > resumed_at:
                save_checkpoint(self.model, folder, step)

    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    folder = out.parent / (out.name + ".checkpoints")
    newest = newest_checkpoint(folder)
    if newest is None:
        actions = env.action_space.shape[0]
        model = TD3(
            "MlpPolicy",
            env,
            learning_rate=3e-4,
            buffer_size=1_000_000,
            learning_starts=learning_starts,
            batch_size=256,
            tau=0.005,
            gamma=0.99,
            train_freq=1,
            gradient_steps=1,
            action_noise=NormalActionNoise(np.zeros(actions), 0.1 * np.ones(actions)),
            policy_delay=2,
            target_policy_noise=0.2,
            target_noise_clip=0.5,
            policy_kwargs=dict(net_arch=[256, 256]),
            seed=seed,
            device="cpu",
        )
        out.write_text("")
    else:
        model = TD3.load(newest / "model.zip", env=env, device="cpu")
        model.load_replay_buffer(newest / "replay.pkl")
        model._last_obs = None  # the env is a fresh one: learn() resets it
        model.set_random_seed(seed + model.num_timesteps)
        kept = [
            line
            for line in out.read_text().splitlines()
            if json.loads(line)["step"] <= model.num_timesteps
        ]
        out.write_text("".join(line + "\n" for line in kept))
    resumed_at = model.num_timesteps
    model.set_logger(Logger(None, []))  # SB3's default makes an empty /tmp/SB3-<date> per run
    with out.open("a") as file:
        model.learn(steps - resumed_at, callback=Episodes(file), reset_num_timesteps=False)
    if checkpoint_every and model.num_timesteps > resumed_at:  # the end, to go on from
        save_checkpoint(model, folder, model.num_timesteps)


CHECKPOINTS = "step_" + "[0-9]" * 9  # complete ones; one being written is step_N.tmp


def newest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint in `folder`, or None."""
    done = sorted(folder.glob(CHECKPOINTS))
    return done[-1] if done else None


def save_checkpoint(model, folder: Path, step: int) -> None:
    """Model and replay buffer into step_N.tmp, renamed when whole; older ones removed."""
    done = folder / f"step_{step:09d}"
    partial = done.with_suffix(".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save(partial / "model.zip")
    model.save_replay_buffer(partial / "replay.pkl")
    partial.rename(done)
    for older in folder.glob(CHECKPOINTS):
        if older.name < done.name:
            shutil.rmtree(older)


def summary(path: Path, window: int = 25_000) -> str:
    """Mean return (and median length) of the episodes ending in each window of steps."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    steps = np.array([r["step"] for r in rows])
    returns = np.array([r["return"] for r in rows])
    lengths = np.array([r["length"] for r in rows])
    parts = []
    for low in range(0, int(steps.max()) + 1, window):
        inside = (steps >= low) & (steps < low + window)
        if inside.any():
            parts.append(
                f"{low // 1000}k: {returns[inside].mean():.0f} "
                f"({np.median(lengths[inside]):.0f} steps)"
            )
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", nargs="?", default="Walker2d-v4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--out", type=Path, default=Path("sb3_td3.jsonl"))
    every = "save every N steps in OUT.checkpoints/ and continue from the newest there"
    parser.add_argument("--checkpoint-every", type=int, default=0, help=every)
    parser.add_argument("--summary", type=Path, help="print a curve written before, and stop")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.summary))
        return
    train(args.env, args.seed, args.steps, args.out, args.checkpoint_every)
    print(summary(args.out))


if __name__ == "__main__":
    main()
