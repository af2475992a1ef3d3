"""Goal-conditioned envs, in Gymnasium-Robotics' convention: a Dict observation of
`observation`, `achieved_goal` and `desired_goal`, an unwrapped env with
`compute_reward(achieved_goal, desired_goal, info)` (and maybe `compute_terminated`), and
`info["is_success"]` (PointMaze: `info["success"]`) telling whether an episode reached its
goal. What a run needs of them: the successes of the episodes that ended, and the
Hindsight (storage/hindsight.py) that relabels a replay buffer's transitions."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlstore.errors import UsageError
from rlstore.storage.hindsight import GOAL_KEYS, Hindsight

SUCCESS_KEYS = ("is_success", "success")


def ended_successes(info: dict[str, Any], ended: np.ndarray) -> list[float]:
    """From a vector env's step infos, the successes (1.0 or 0.0) of the envs whose episode
    `ended` at this step and that say whether it succeeded."""
    for key in SUCCESS_KEYS:
        if key in info:
            said = np.asarray(info.get("_" + key, np.ones(len(ended), dtype=bool)))
            return [float(v) for v in np.asarray(info[key])[ended & said]]
    return []


def episode_success(info: dict[str, Any]) -> float | None:
    """One env's success at its episode's last step, from its info (None: not said)."""
    for key in SUCCESS_KEYS:
        if key in info:
            return float(info[key])
    return None


def is_goal_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Dict) and set(GOAL_KEYS) <= set(space.spaces)


def hindsight_for(env: gym.Env, env_id: str, goals: int, strategy: str) -> Hindsight:
    """The Hindsight of a run on `env` (one env, kept open for its functions), or a
    UsageError saying why HER cannot relabel its transitions."""
    space = env.observation_space
    if not is_goal_space(space):
        keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else None
        seen = f"a Dict of {keys}" if keys is not None else str(space)
        raise UsageError(
            f"--her needs a goal-conditioned env, whose observation is a Dict of "
            f"{', '.join(GOAL_KEYS)}; {env_id} observes {seen}; train without --her"
        )
    if space["achieved_goal"].shape != space["desired_goal"].shape:
        raise UsageError(
            f"--her needs achieved_goal and desired_goal of one shape; {env_id} has "
            f"{space['achieved_goal'].shape} and {space['desired_goal'].shape}"
        )
    unwrapped = env.unwrapped
    if not callable(getattr(unwrapped, "compute_reward", None)):
        raise UsageError(
            f"--her recomputes rewards with the env's compute_reward(achieved_goal, "
            f"desired_goal, info), which {env_id} ({type(unwrapped).__name__}) does not have; "
            "add it to the env, or train without --her"
        )
    terminated = getattr(unwrapped, "compute_terminated", None)
    hindsight = Hindsight(
        unwrapped.compute_reward, terminated if callable(terminated) else None, goals, strategy
    )
    check_on_arrays(hindsight, space, env_id)
    return hindsight


def check_on_arrays(hindsight: Hindsight, space: gym.spaces.Dict, env_id: str) -> None:
    """A UsageError unless the env's functions take arrays of goals, one per row (HER calls
    them once per batch): tried on three goals drawn from the space, before training."""
    samples = [space.sample() for _ in range(3)]
    achieved, desired = (
        np.stack([s[key] for s in samples]) for key in ("achieved_goal", "desired_goal")
    )
    try:
        hindsight.rewards_and_terminations(achieved, desired, np.zeros(3, dtype=bool))
    except Exception as e:  # any failure of the user's functions says the same
        raise UsageError(
            f"--her calls {env_id}'s compute_reward (and compute_terminated) once per batch, "
            f"with arrays of goals, one per row; on three goals it failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); make it "
            "work on arrays, as Gymnasium-Robotics' envs do"
        ) from None
