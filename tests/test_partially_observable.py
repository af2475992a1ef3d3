"""rlstore's partially observable ids (rlstore/partially_observable.py): the full env's
dynamics and rewards, with the velocities left out of the observation."""

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import rlstore.envs  # noqa: F401  (registers the ids)


@pytest.mark.parametrize(
    "env_id, full_id, kept",
    [("CartPoleNoVel-v1", "CartPole-v1", [0, 2]), ("PendulumNoVel-v1", "Pendulum-v1", [0, 1])],
)
def test_an_episode_is_the_full_envs_without_its_velocities(env_id, full_id, kept):
    env, full = gym.make(env_id), gym.make(full_id)
    assert env.spec.max_episode_steps == full.spec.max_episode_steps
    assert env.observation_space.shape == (len(kept),)
    rng = np.random.default_rng(0)
    for seed in (1, 2):
        obs, _ = env.reset(seed=seed)
        full_obs, _ = full.reset(seed=seed)
        assert np.array_equal(obs, full_obs[kept]) and env.observation_space.contains(obs)
        done, steps = False, 0
        while not done:
            if isinstance(full.action_space, gym.spaces.Box):
                action = rng.uniform(-2, 2, size=1).astype(np.float32)
            else:
                action = int(rng.integers(2))
            obs, reward, terminated, truncated, _ = env.step(action)
            full_obs, full_reward, full_terminated, full_truncated, _ = full.step(action)
            assert np.array_equal(obs, full_obs[kept]) and reward == full_reward
            assert (terminated, truncated) == (full_terminated, full_truncated)
            done, steps = terminated or truncated, steps + 1
        assert steps > 1


def test_importing_rlstore_after_gymnasium_registers_the_ids():
    code = "import gymnasium as gym, rlstore; print(gym.make('CartPoleNoVel-v1').spec.id)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "CartPoleNoVel-v1"
