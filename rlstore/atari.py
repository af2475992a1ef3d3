"""Atari: the standard preprocessing, built for any ALE id without the user listing it.

Frame skip 4 with max-pooling over the last two frames, 84x84 grayscale, a stack of the
last 4 frames (zeros before an episode's first frame), up to 30 no-op starts, FIRE on
reset where the game needs it (and, with --fire-on-life-loss, after every lost life), sticky
actions off (the published tables use none; the v5
ids' 0.25 comes back with --sticky-actions). Rewards come out unclipped, so logged returns
are whole games as papers report them; the trainers clip them to their sign for learning.
A lost life is reported in `envs.life_lost` after each step (docs/reference/episode-boundaries.md):
the learners cut the bootstrap there while the game goes on.

ale-py's own AtariVectorEnv (preprocessing in C++, threads) is used when it is there and
the vectorization allows it; otherwise Gymnasium's wrappers over single ALE envs.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from rlstore.errors import UsageError

FRAME_STACK = 4
FRAME_SKIP = 4
SCREEN_SIZE = 84
NOOP_MAX = 30
STICKY_PROBABILITY = 0.25  # the v5 ids' default, restored by --sticky-actions


def is_atari(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether the env is an ALE game (ALE/Breakout-v5, BreakoutNoFrameskip-v4, ...)."""
    entry = spec.entry_point
    return isinstance(entry, str) and entry.startswith("ale_py")


def make_atari_envs(
    spec: gym.envs.registration.EnvSpec,
    num_envs: int,
    vectorization: str = "auto",
    sticky_actions: bool = False,
    max_episode_steps: int | None = None,
    fire_on_life_loss: bool = False,
) -> gym.vector.VectorEnv:
    """`num_envs` preprocessed copies of an ALE game as one NEXT_STEP vector env with
    `life_lost` (see the module docstring). Seeded by the caller's first reset(seed=...).
    `fire_on_life_loss` needs Gymnasium's wrappers: ale-py's vector env has no such step."""
    if fire_on_life_loss and vectorization == "native":
        raise UsageError(
            "--fire-on-life-loss needs Gymnasium's Atari wrappers, not ale-py's native vector "
            "env; use --vectorization auto, sync or async"
        )
    game = spec.kwargs["game"]
    sticky = STICKY_PROBABILITY if sticky_actions else 0.0
    max_frames = spec.kwargs.get("max_num_frames_per_episode", 108_000)
    if max_episode_steps is not None:
        max_frames = max_episode_steps * FRAME_SKIP
    native = vectorization in ("auto", "native") and not fire_on_life_loss
    vector_env = _ale_vector_env_class() if native else None
    if vector_env is not None:
        envs = vector_env(
            game,
            num_envs,
            num_threads=min(num_envs, os.cpu_count() or 1),
            repeat_action_probability=sticky,
            max_num_frames_per_episode=max_frames,
            frameskip=FRAME_SKIP,
            img_height=SCREEN_SIZE,
            img_width=SCREEN_SIZE,
            stack_num=FRAME_STACK,
            grayscale=True,
            maxpool=True,
            noop_max=NOOP_MAX,
            use_fire_reset=True,
            episodic_life=False,
            reward_clipping=False,
            autoreset_mode=AutoresetMode.NEXT_STEP,
        )
    else:
        make = functools.partial(_preprocessed_env, spec.id, sticky, max_frames, fire_on_life_loss)
        vector_cls = (
            gym.vector.AsyncVectorEnv if vectorization == "async" else gym.vector.SyncVectorEnv
        )
        envs = vector_cls([make] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    return LifeLoss(envs)


def _ale_vector_env_class() -> type | None:
    try:
        from ale_py.vector_env import AtariVectorEnv
    except ImportError:  # ale-py before 0.11
        return None
    return AtariVectorEnv


def _preprocessed_env(
    env_id: str, sticky: float, max_frames: int, fire_on_life_loss: bool = False
) -> gym.Env:
    env = gym.make(
        env_id,
        frameskip=1,  # AtariPreprocessing skips and max-pools
        repeat_action_probability=sticky,
        max_num_frames_per_episode=max_frames,
    )
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE
    )
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
        if fire_on_life_loss:
            env = FireOnLifeLoss(env)
    return gym.wrappers.FrameStackObservation(env, FRAME_STACK, padding_type="zero")


class FireReset(gym.Wrapper):
    """Press FIRE after each reset (games such as Breakout wait for it), as ALE's vector env
    does; a game that ends on that step is reset again."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset()
        return obs, info


class FireOnLifeLoss(gym.Wrapper):
    """Press FIRE right after a step that lost a life (the game goes on), as CleanRL's and
    baselines' wrappers do through their life-loss resets. The FIRE step is part of the
    agent's step: its frames and reward are added to it, and it is not a transition."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.lives = info["lives"]
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if info["lives"] < self.lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(1)
            reward += fire_reward
        self.lives = info["lives"]
        return obs, reward, terminated, truncated, info


class LifeLoss(gym.vector.VectorWrapper):
    """Adds `life_lost` (bool per env, after each step): the env lost a life and the game
    goes on. A game's end is a termination, never a life loss."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.life_lost = np.zeros(self.num_envs, dtype=bool)
        self._lives = np.zeros(self.num_envs, dtype=np.int64)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._lives = np.asarray(info["lives"], dtype=np.int64).copy()
        self.life_lost = np.zeros(self.num_envs, dtype=bool)
        return obs, info

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = np.asarray(info["lives"], dtype=np.int64)
        self.life_lost = (lives < self._lives) & ~(terminated | truncated)
        self._lives = lives.copy()
        return obs, reward, terminated, truncated, info
