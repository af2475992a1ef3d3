"""A FrozenLake policy's mode, state by state, against the optimal policy: the exact success
rate within the time limit of the deterministic policy that load_policy's actions make, and
the states where its action is worse than the optimal one (ties aside). For issue 77's
PPO row (results/ablation-frozenlake-ppo.md).

    python scripts/frozenlake_modes.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import rlstore

HORIZON = 100  # FrozenLake-v1's time limit


def q_values(dynamics: dict, gamma: float = 0.99, sweeps: int = 2000) -> np.ndarray:
    """Q* of the 4x4 lake by value iteration (16 states, 4 actions)."""
    v = np.zeros(16)
    for _ in range(sweeps):
        q = np.zeros((16, 4))
        for s in range(16):
            for a in range(4):
                for p, s2, r, done in dynamics[s][a]:
                    q[s, a] += p * (r + (0.0 if done else gamma * v[s2]))
        v = q.max(1)
    return q


def success(dynamics: dict, actions: np.ndarray) -> float:
    """P(reaching the goal from the start within HORIZON steps) of a deterministic policy."""
    v = np.zeros(16)
    for _ in range(HORIZON):
        new = np.zeros(16)
        for s in range(16):
            for p, s2, r, done in dynamics[s][int(actions[s])]:
                new[s] += p * (r + (0.0 if done else v[s2]))
        v = new
    return float(v[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    dynamics = gym.make("FrozenLake-v1").unwrapped.P
    q = q_values(dynamics)
    optimal = q.argmax(1)
    print(f"optimal policy: success {success(dynamics, optimal):.3f}")
    for run in args.runs:
        actions = rlstore.load_policy(run)(np.arange(16))
        worse = [s for s in range(16) if q[s, actions[s]] < q[s].max() - 1e-9 and q[s].max() > 0]
        print(f"{run}: success {success(dynamics, actions):.3f}; worse than optimal at {worse}")


if __name__ == "__main__":
    main()
