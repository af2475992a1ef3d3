"""SB3's TD3 + HerReplayBuffer on PointMaze_UMaze-v3 at the settings of `rlstore benchmark
her`'s td3-her row, side by side with it (issue 59).

    pip install -e ".[bench,robotics]"
    python scripts/sb3_her.py [RESULTS_JSON]   # 3 seeds; writes results/sb3-her.*
    python scripts/sb3_her.py --table [RESULTS_JSON]  # the table again, SB3's runs as saved
    python scripts/sb3_her.py RESULTS_JSON --seeds 2 3  # these seeds, added to the saved

RESULTS_JSON: the suite's results.json (default benchmarks/her/results.json); its td3-her
row goes beside SB3's in the table. Settings, rlstore's TD3 defaults (CleanRL's) and the
row's overrides: 50,000 steps, learning from step 1,000, lr 3e-4, batch 256, buffer 1M,
gamma 0.99, tau 0.005, Gaussian exploration noise 0.1, policy delay 2, target noise 0.2
clipped at 0.5, 256-256 ReLU; HER future with 4 goals per real one. Score: the success
rate (info["success"] at the last step) of 50 deterministic episodes of the final policy
(seeds 10000 + i).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ENV = "PointMaze_UMaze-v3"
STEPS = 50_000
EPISODES = 50
SEEDS = (1, 2, 3)


def train(seed: int):
    import gymnasium_robotics
    from stable_baselines3 import TD3, HerReplayBuffer
    from stable_baselines3.common.noise import NormalActionNoise

    gym.register_envs(gymnasium_robotics)
    env = gym.make(ENV)
    noise = NormalActionNoise(np.zeros(2), 0.1 * np.ones(2))
    model = TD3(
        "MultiInputPolicy",
        env,
        learning_rate=3e-4,
        buffer_size=1_000_000,
        learning_starts=1000,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        action_noise=noise,
        policy_delay=2,
        target_policy_noise=0.2,
        target_noise_clip=0.5,
        replay_buffer_class=HerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"),
        policy_kwargs=dict(net_arch=[256, 256]),
        seed=seed,
        device="cpu",
    )
    return model.learn(STEPS)


def evaluate(model) -> tuple[float, float]:
    """(success rate, mean return) over EPISODES deterministic episodes."""
    env = gym.make(ENV)
    successes, returns = [], []
    for i in range(EPISODES):
        obs, _ = env.reset(seed=10_000 + i)
        done, total, info = False, 0.0, {}
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, info = env.step(action)
            total, done = total + float(reward), terminated or truncated
        successes.append(float(info["success"]))
        returns.append(total)
    return float(np.mean(successes)), float(np.mean(returns))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results_json", nargs="?", default="benchmarks/her/results.json")
    parser.add_argument("--table", action="store_true", help="no runs: the saved ones")
    parser.add_argument("--seeds", type=int, nargs="+", help="these seeds, added to the saved")
    args = parser.parse_args()
    suite_results = Path(args.results_json)
    out = ROOT / "results" / "sb3-her"
    saved = out.with_suffix(".json")
    seeds = () if args.table else tuple(args.seeds or SEEDS)
    keep = args.table or args.seeds  # the saved runs stay, but for the seeds rerun
    runs = json.loads(saved.read_text())["sb3"]["runs"] if keep and saved.exists() else []
    runs = [r for r in runs if r["seed"] not in seeds]
    for seed in seeds:
        start = time.perf_counter()
        model = train(seed)
        seconds = time.perf_counter() - start
        success, mean_return = evaluate(model)
        runs.append(
            {
                "seed": seed,
                "success_rate": success,
                "mean_return": mean_return,
                "wall_seconds": seconds,
            }
        )
        print(runs[-1], flush=True)
    runs.sort(key=lambda r: r["seed"])
    rates = [r["success_rate"] for r in runs]
    sb3 = {
        "env": ENV,
        "steps": STEPS,
        "runs": runs,
        "mean": float(np.mean(rates)),
        "std": float(np.std(rates)),
    }
    ours = None
    if suite_results.is_file():
        rows = json.loads(suite_results.read_text())["rows"]
        ours = next((r for r in rows if r["name"] == "td3-her"), None)
    out.with_suffix(".json").write_text(json.dumps({"sb3": sb3, "rlstore": ours}, indent=1) + "\n")
    seeds_run = ", ".join(str(r["seed"]) for r in runs)
    lines = [
        f"# TD3 + HER on {ENV}: SB3 beside rlstore (scripts/sb3_her.py)",
        "",
        f"`python scripts/sb3_her.py {suite_results}`: {STEPS:,} steps, seeds "
        f"{seeds_run}, the success rate of {EPISODES} deterministic episodes of the "
        "final policy each; the same settings as `rlstore benchmark her`'s td3-her row "
        "(listed in the script's docstring). Wall time per run, on the machine as it "
        "was (threads and what else ran: below).",
        "",
        "| trainer | success rates | mean +- std | wall s/run |",
        "|---|---|---|---|",
    ]
    wall = np.mean([r["wall_seconds"] for r in runs])
    lines.append(
        f"| SB3 TD3 + HerReplayBuffer | {', '.join(f'{r:.2f}' for r in rates)} | "
        f"{sb3['mean']:.2f} +- {sb3['std']:.2f} | {wall:.0f} |"
    )
    if ours is not None:
        scores = ", ".join(f"{run['score']:.2f}" for run in ours["runs"])
        lines.append(
            f"| rlstore td3 --her | {scores} | {ours['score_mean']:.2f} +- "
            f"{ours['score_std']:.2f} | {ours['wall_seconds']:.0f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
