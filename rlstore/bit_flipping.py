"""The bit-flipping env of the HER paper (Andrychowicz et al. 2017, section 3.1), a
goal-conditioned env in Gymnasium-Robotics' convention:

    BitFlipping-v0   n bits (--env-kwargs n_bits=N, 10 by default); action i flips bit i;
                     reward -1 until the bits equal the goal, 0 there (and the episode
                     terminates); episodes are truncated after n steps.

The observation is a Dict of MultiBinary(n) parts: `observation` and `achieved_goal` (both
the bits), `desired_goal` (the goal). Start and goal are drawn uniformly. Without hindsight
replay an agent almost never sees the goal once n grows past about 10, which is what the
paper's figure 1 shows. rlstore registers it as it registers CartPoleNoVel-v1.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class BitFlippingEnv(gym.Env):
    metadata = {"render_modes": ["ansi"]}

    def __init__(self, n_bits: int = 10, render_mode: str | None = None) -> None:
        if n_bits < 1:
            raise ValueError(f"n_bits must be at least 1, got {n_bits}")
        self.n_bits, self.render_mode = n_bits, render_mode
        bits = spaces.MultiBinary(n_bits)
        self.observation_space = spaces.Dict(
            {"observation": bits, "achieved_goal": bits, "desired_goal": bits}
        )
        self.action_space = spaces.Discrete(n_bits)
        self.state = np.zeros(n_bits, dtype=np.int8)
        self.goal = np.zeros(n_bits, dtype=np.int8)
        self.steps = 0

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            "observation": self.state.copy(),
            "achieved_goal": self.state.copy(),
            "desired_goal": self.goal.copy(),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.state[int(action)] ^= 1
        self.steps += 1
        success = bool(self.compute_terminated(self.state, self.goal, {}))
        reward = float(self.compute_reward(self.state, self.goal, {}))
        truncated = self.steps >= self.n_bits and not success
        return self._obs(), reward, success, truncated, {"is_success": success}

    @staticmethod
    def compute_reward(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> Any:
        """-1 where the bits differ from the goal, 0 where they equal it (arrays of goals
        give one reward per row)."""
        return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1).astype(
            np.float64
        )

    @staticmethod
    def compute_terminated(achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> Any:
        return np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            bits = "".join(map(str, self.state))
            return f"{bits} -> {''.join(map(str, self.goal))}"
        return None


def register() -> None:
    """Register BitFlipping-v0 with gymnasium (again is a no-op)."""
    if "BitFlipping-v0" not in gym.registry:
        gym.register("BitFlipping-v0", entry_point=f"{__name__}:BitFlippingEnv")
