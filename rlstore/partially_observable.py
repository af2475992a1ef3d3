"""Partially observable classic-control envs, as RL Zoo ships them for recurrent policies:
the velocities are left out of the observation, so that a policy must remember earlier
observations to act well.

    CartPoleNoVel-v1   CartPole-v1 observing (cart position, pole angle); 500 steps
    PendulumNoVel-v1   Pendulum-v1 observing (cos, sin) of the angle; 200 steps

The dynamics, rewards, time limits and rendering are the full envs'. rlstore registers
them when it is imported with gymnasium already loaded, and whenever it builds envs
(rlstore.envs); `register()` does it by hand.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.classic_control import CartPoleEnv, PendulumEnv

KEPT_CARTPOLE = [0, 2]  # x, theta (x_dot and theta_dot left out)
KEPT_PENDULUM = [0, 1]  # cos(theta), sin(theta) (theta_dot left out)


class _KeptObservation:
    """Mixed in before a classic env class: its observations keep the entries KEPT."""

    KEPT: list[int]

    def _keep_only(self) -> None:
        full = self.observation_space
        self.observation_space = spaces.Box(
            full.low[self.KEPT], full.high[self.KEPT], dtype=np.float32
        )

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict]:
        obs, info = super().reset(**kwargs)
        return obs[self.KEPT], info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[self.KEPT], reward, terminated, truncated, info


class CartPoleNoVelEnv(_KeptObservation, CartPoleEnv):
    """CartPole whose observation is (cart position, pole angle)."""

    KEPT = KEPT_CARTPOLE

    def __init__(self, render_mode: str | None = None) -> None:
        super().__init__(render_mode=render_mode)
        self._keep_only()


class PendulumNoVelEnv(_KeptObservation, PendulumEnv):
    """Pendulum whose observation is (cos, sin) of the angle."""

    KEPT = KEPT_PENDULUM

    def __init__(self, render_mode: str | None = None, g: float = 10.0) -> None:
        super().__init__(render_mode=render_mode, g=g)
        self._keep_only()


ENVS = {
    "CartPoleNoVel-v1": (CartPoleNoVelEnv, 500, 475.0),
    "PendulumNoVel-v1": (PendulumNoVelEnv, 200, None),
}


def register() -> None:
    """Register the ids with gymnasium (again is a no-op)."""
    for env_id, (cls, max_steps, threshold) in ENVS.items():
        if env_id not in gym.registry:
            gym.register(
                env_id,
                entry_point=f"{__name__}:{cls.__name__}",
                max_episode_steps=max_steps,
                reward_threshold=threshold,
            )
