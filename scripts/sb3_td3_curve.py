"""stable-baselines3's TD3 at CleanRL's td3_continuous_action.py settings, for a learning
curve to set beside rlstore's on the same env, MuJoCo version and machine (needs
rlstore[bench]; MuJoCo envs need rlstore[mujoco]).

    python scripts/sb3_td3_curve.py Walker2d-v4 --seed 1 --steps 300000 --out sb3.jsonl
    python scripts/sb3_td3_curve.py --summary sb3.jsonl        # 25k-step windows

Writes one JSON line per finished episode (env step, return, length). SB3's TD3 step equals
rlstore's from the same weights, batches and draws (tests/test_sac_td3.py), so what such a
curve can tell apart is the rest: collection, the replay buffer, seeds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def train(env_id: str, seed: int, steps: int, out: Path) -> None:
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
                    row = {"step": self.num_timesteps, "return": float(info["episode"]["r"]),
                           "length": int(info["episode"]["l"])}  # fmt: skip
                    self.file.write(json.dumps(row) + "\n")
                    self.file.flush()
            return True

    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    actions = env.action_space.shape[0]
    model = TD3(
        "MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000, learning_starts=25_000,
        batch_size=256, tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
        action_noise=NormalActionNoise(np.zeros(actions), 0.1 * np.ones(actions)),
        policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5,
        policy_kwargs=dict(net_arch=[256, 256]), seed=seed, device="cpu",
    )  # fmt: skip
    model.set_logger(Logger(None, []))  # SB3's default makes an empty /tmp/SB3-<date> per run
    with out.open("w") as file:
        model.learn(steps, callback=Episodes(file))


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
            parts.append(f"{low // 1000}k: {returns[inside].mean():.0f} "
                         f"({np.median(lengths[inside]):.0f} steps)")  # fmt: skip
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", nargs="?", default="Walker2d-v4")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--out", type=Path, default=Path("sb3_td3.jsonl"))
    parser.add_argument("--summary", type=Path, help="print a curve written before, and stop")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.summary))
        return
    train(args.env, args.seed, args.steps, args.out)
    print(summary(args.out))


if __name__ == "__main__":
    main()
