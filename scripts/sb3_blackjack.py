"""SB3's PPO and DQN on Blackjack-v1 at the settings of `rlstore benchmark spaces`'
Blackjack rows, for the rows' reference bands (issue: within 0.05 of SB3's return at the
same steps and seeds).

    pip install -e ".[bench]"
    python scripts/sb3_blackjack.py          # 3 seeds each; writes results/sb3-blackjack.*

SB3 takes no Tuple observations: Blackjack's (Discrete(32), Discrete(11), Discrete(2)) goes
to it through Gymnasium's FlattenObservation, the concatenated one-hots, which is what
rlstore's encoder makes of the Tuple. Hyperparameters are rlstore's defaults: PPO 4 envs
x 128 steps, 4 epochs of 4 minibatches, lr 2.5e-4 annealed, clip 0.2, entropy 0.01, 64-64
tanh; DQN CleanRL's classic settings (120-84 ReLU, buffer 10k, batch 128, lr 2.5e-4, train
every 10 steps, target every 500, epsilon 1 -> 0.05 over half of the steps, learning from
step 10k; SB3's Huber loss, which the rlstore row sets too, and no gradient clipping, as
in scripts/benchmark.py). Score: the mean return of 1,000 deterministic evaluation
episodes (seeds 10000 + i), as the rows' `score = "evaluation"`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
STEPS = 100_000
EPISODES = 1000


def flat_blackjack() -> gym.Env:
    return gym.wrappers.FlattenObservation(gym.make("Blackjack-v1"))


def train(algo: str, seed: int):
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env

    if algo == "ppo":
        schedule = lambda progress: 2.5e-4 * progress  # noqa: E731 (annealed, as rlstore's)
        model = PPO(
            "MlpPolicy",
            make_vec_env(flat_blackjack, n_envs=4, seed=seed),
            n_steps=128,
            batch_size=128,
            n_epochs=4,
            learning_rate=schedule,
            ent_coef=0.01,
            clip_range=0.2,
            clip_range_vf=0.2,
            max_grad_norm=0.5,
            seed=seed,
            device="cpu",
            policy_kwargs=dict(
                net_arch=dict(pi=[64, 64], vf=[64, 64]),
                activation_fn=torch.nn.Tanh,
                optimizer_kwargs=dict(eps=1e-5),
            ),
        )
    else:
        model = DQN(
            "MlpPolicy",
            make_vec_env(flat_blackjack, n_envs=1, seed=seed),
            learning_rate=2.5e-4,
            buffer_size=10_000,
            learning_starts=10_000,
            batch_size=128,
            gamma=0.99,
            train_freq=10,
            gradient_steps=1,
            target_update_interval=500,
            exploration_fraction=0.5,
            exploration_initial_eps=1.0,
            exploration_final_eps=0.05,
            max_grad_norm=1e10,
            seed=seed,
            device="cpu",
            policy_kwargs=dict(net_arch=[120, 84]),
        )
    return model.learn(STEPS)


def evaluate(model) -> float:
    env = flat_blackjack()
    returns = []
    for i in range(EPISODES):
        obs, _ = env.reset(seed=10_000 + i)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def main() -> None:
    results = {}
    for algo in sys.argv[1:] or ("ppo", "dqn"):
        scores = [evaluate(train(algo, seed)) for seed in (1, 2, 3)]
        results[algo] = {
            "seeds": [1, 2, 3],
            "scores": scores,
            "mean": float(np.mean(scores)),
            "std": float(np.std(scores)),
            "steps": STEPS,
        }
        print(algo, results[algo], flush=True)
    out = ROOT / "results" / "sb3-blackjack"
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# SB3 on Blackjack-v1 (scripts/sb3_blackjack.py)",
        "",
        f"`python scripts/sb3_blackjack.py`: {STEPS:,} steps, seeds 1-3, the mean return "
        f"of {EPISODES:,} deterministic episodes each; the references of "
        "`rlstore benchmark spaces`' Blackjack rows.",
        "",
        "| algorithm | scores | mean +- std |",
        "|---|---|---|",
    ]
    for algo, r in results.items():
        scores = ", ".join(f"{s:.3f}" for s in r["scores"])
        lines.append(f"| {algo.upper()} | {scores} | {r['mean']:.3f} +- {r['std']:.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
