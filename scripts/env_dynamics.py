"""Does an env step the same under two installs (two MuJoCo versions, say)? Steps it from
seeded resets with seeded random actions, writes what it saw, and compares two such files.

    python scripts/env_dynamics.py Hopper-v4 --out hopper-4.0.0.npz    # in one venv
    python scripts/env_dynamics.py Hopper-v4 --out hopper-3.4.0.npz    # in another
    python scripts/env_dynamics.py --compare hopper-3.4.0.npz hopper-4.0.0.npz

Published scores were made on the versions of their day; when an env's physics changed
since, a score on today's install is a score on another env (results/learning-offpolicy.md).
It needs gymnasium and the env's engine only, not rlstore, so it runs in any venv.
"""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np


def installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "none"


def record(env_id: str, out: Path, episodes: int = 5, max_steps: int = 1000) -> None:
    """`episodes` episodes (reset seeds 0, 1, ...; each episode's actions drawn from its own
    seed, so one episode's length does not shift the next one's actions), at most
    `max_steps` steps each, into `out`: observations, rewards, terminations."""
    import gymnasium as gym

    env = gym.make(env_id)
    arrays: dict[str, np.ndarray] = {}
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        env.action_space.seed(episode)
        observations, rewards, terminations = [obs], [], []
        for _ in range(max_steps):
            action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            rewards.append(reward)
            terminations.append(terminated)
            if terminated or truncated:
                break
        arrays |= {
            f"obs{episode}": np.array(observations),
            f"rew{episode}": np.array(rewards),
            f"term{episode}": np.array(terminations),
        }
    env.close()
    versions = f"gymnasium {installed('gymnasium')}, mujoco {installed('mujoco')}"
    with open(out, "wb") as file:  # a path, np.savez would add .npz to a name without it
        np.savez(file, env_id=env_id, versions=versions, episodes=episodes, **arrays)


def compare(first: Path, second: Path, tolerance: float = 1e-9) -> str:
    """One line per episode: equal (to `tolerance`), or the first step whose observations
    differ by more, with the gap just before it; and each side's length and return."""
    a, b = np.load(first), np.load(second)
    lines = [f"{a['env_id']}: {a['versions']} vs {b['versions']}"]
    for episode in range(int(a["episodes"])):
        obs_a, obs_b = a[f"obs{episode}"], b[f"obs{episode}"]
        n = min(len(obs_a), len(obs_b))
        gap = np.abs(obs_a[:n] - obs_b[:n]).max(axis=1)
        lengths = f"{len(obs_a) - 1} vs {len(obs_b) - 1} steps"
        returns = f"return {a[f'rew{episode}'].sum():.1f} vs {b[f'rew{episode}'].sum():.1f}"
        if len(obs_a) == len(obs_b) and gap.max() <= tolerance:
            lines.append(f"episode {episode}: equal to {gap.max():.0e} ({lengths}, {returns})")
        elif gap.max() <= tolerance:  # the same steps while both ran, then one ended
            lines.append(
                f"episode {episode}: equal to {gap.max():.0e} for {n - 1} steps, "
                f"then one ended ({lengths}, {returns})"
            )
        else:
            step = int(np.argmax(gap > tolerance))
            # a gap that grows smoothly from rounding is chaos amplifying the last digits;
            # one that jumps from rounding to centimetres in a step is other physics
            before = f"{gap[step - 1]:.0e} the step before" if step else "at the reset"
            lines.append(
                f"episode {episode}: differs from step {step}: {before}, "
                f"{gap[step]:.1e} there, {gap.max():.2g} at most "
                f"({lengths}, {returns})"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env_id", nargs="?")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("FIRST", "SECOND"))
    args = parser.parse_args()
    if args.compare:
        missing = [str(path) for path in args.compare if not path.is_file()]
        if missing:
            parser.error(f"no recording at {', '.join(missing)}: make one with ENV_ID --out FILE")
        print(compare(*args.compare))
    elif args.env_id and args.out:
        record(args.env_id, args.out, args.episodes)
    else:
        parser.error("give ENV_ID --out FILE to record, or --compare FIRST SECOND")


if __name__ == "__main__":
    main()
