"""LeanSyncVectorEnv: envs stepped one after the other in this process into preallocated
arrays, Gymnasium's SyncVectorEnv step for step (tests/test_fast.py), without its per-step
copies and info merging. rlstore's sync vector env for Box observations when fast paths are
on (rlstore/envs.py); the lean loop steps (rlstore/lean.py) step it themselves.
docs/maintainers/fast-paths.md says what it buys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space


class LeanSyncVectorEnv(gym.vector.VectorEnv):
    """Envs stepped one after the other in this process, NEXT_STEP autoreset, for Box
    observations: the results of Gymnasium's SyncVectorEnv, step for step, written into
    preallocated arrays. Supports `reset(options={"reset_mask": mask})` as Gymnasium does.
    With `infos=False` the step's infos are not gathered (an empty dict): merging them costs
    more than some envs' own step, and rlstore's loops do not read them.
    (Discrete observations are accepted, for rlstore to refuse them with a clear message.)
    """

    # For checkpoints (rlstore/env_state.py): its envs step in this process, in `envs`, as a
    # SyncVectorEnv's do, so their states are saved the same way.
    in_process_envs = True

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], infos: bool = True) -> None:
        self.gather_infos = infos
        first = env_fns[0]()
        if not isinstance(first.observation_space, (gym.spaces.Box, gym.spaces.Discrete)):
            first.close()
            raise TypeError(
                f"LeanSyncVectorEnv needs Box observations, not {first.observation_space}"
            )
        self.envs = [first] + [make() for make in env_fns[1:]]
        self.num_envs = len(self.envs)
        self.metadata = {**first.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.spec, self.render_mode = first.spec, first.render_mode
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        space = self.single_observation_space
        self.observations = np.zeros((self.num_envs, *space.shape), dtype=space.dtype)
        self.rewards = np.zeros(self.num_envs, dtype=np.float64)
        self.terminations = np.zeros(self.num_envs, dtype=bool)
        self.truncations = np.zeros(self.num_envs, dtype=bool)
        self.autoreset = np.zeros(self.num_envs, dtype=bool)  # the next step is a pseudo-step
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        seeds = [None] * self.num_envs if seed is None else seed
        if isinstance(seeds, int):
            seeds = [seeds + i for i in range(self.num_envs)]
        mask = np.ones(self.num_envs, dtype=bool)
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = np.asarray(options.pop("reset_mask"), dtype=bool)
        infos: dict[str, Any] = {}
        for i in np.flatnonzero(mask):
            self.observations[i], info = self.envs[i].reset(seed=seeds[i], options=options)
            infos = self._add_info(infos, info, i)
        self.autoreset[mask] = False
        self.terminations[mask] = False
        self.truncations[mask] = False
        return self.observations.copy(), infos

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        infos: dict[str, Any] = {}
        if self._discrete:  # Python ints: Discrete.contains (each step's assert) is faster
            actions = np.asarray(actions).tolist()
        for i, (action, env) in enumerate(zip(actions, self.envs, strict=True)):
            if self.autoreset[i]:  # the pseudo-step: reset, reward 0, no flags
                self.observations[i], info = env.reset()
                self.rewards[i], self.terminations[i], self.truncations[i] = 0.0, False, False
            else:
                (
                    self.observations[i],
                    self.rewards[i],
                    self.terminations[i],
                    self.truncations[i],
                    info,
                ) = env.step(action)
            if info and self.gather_infos:
                infos = self._add_info(infos, info, i)
        self.autoreset = self.terminations | self.truncations
        return (
            self.observations.copy(),
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            infos,
        )

    def record_steps(
        self,
        observations: np.ndarray,
        rewards: list[float],
        terminations: list[bool],
        truncations: list[bool],
    ) -> None:
        """Take the results of the last step made outside step() (LeanRollout steps the envs
        in `self.envs` itself), as step() would have kept them."""
        self.observations[:] = observations
        self.rewards[:], self.terminations[:] = rewards, terminations
        self.truncations[:] = truncations
        self.autoreset = self.terminations | self.truncations

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Each env's `name`, called with the arguments where it is a method (as
        SyncVectorEnv.call: sb3-contrib's `action_masks()` is read so)."""
        results = []
        for env in self.envs:
            attribute = env.get_wrapper_attr(name)
            results.append(attribute(*args, **kwargs) if callable(attribute) else attribute)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Each env's attribute `name` (as SyncVectorEnv.get_attr)."""
        return tuple(env.get_wrapper_attr(name) for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in getattr(self, "envs", ()):  # (none if making the first env failed)
            env.close()
