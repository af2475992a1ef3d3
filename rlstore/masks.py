"""Action masks: which actions each env allows at its current observation.

An env gives them in one of two conventions, whichever it has:
- `info["action_mask"]` with every reset and step (Gymnasium's: Taxi-v4 does);
- an `action_masks()` method (sb3-contrib's MaskablePPO reads this one).

`ActionMasks` wraps a vector env and reads them after every reset and step, so that
`envs.masks` (num_envs, mask width) bool is always the mask of the observations the envs
just returned, the final observation's at a done step (DQN's target bootstraps with it)
and the reset observation's at the pseudo-step. A Discrete(n) action has n entries, a
MultiDiscrete one sum(nvec), each sub-action's entries in turn. The algorithms store the
masks with the steps, so that updates see the masks collection saw.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlstore.errors import UsageError

INFO_KEY = "action_mask"
NO_MASK_IN_INFO = (
    f"an env gave no info['{INFO_KEY}'] at a step, though it gave one at reset; "
    "give one with every reset and step, or train with --action-masks off"
)
MASK_SOURCES = {"info": f'info["{INFO_KEY}"]', "method": "its action_masks() method"}


def mask_width(action_space: gym.Space) -> int | None:
    """Entries of a mask for `action_space` (None: masks do not apply to it)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return int(action_space.nvec.sum())
    return None


def mask_source(env: gym.Env, reset_info: dict[str, Any]) -> str | None:
    """How one env gives its action masks: "info", "method" or None (it gives none)."""
    if INFO_KEY in reset_info:
        return "info"
    try:
        method = env.get_wrapper_attr("action_masks")
    except AttributeError:
        return None
    return "method" if callable(method) else None


class ActionMasks(gym.vector.VectorWrapper):
    """A vector env whose `masks` are its envs' action masks at their current
    observations (module docstring), checked: shape, dtype, and that an env about to act
    has an allowed action (per sub-action for MultiDiscrete)."""

    def __init__(self, env: gym.vector.VectorEnv, source: str) -> None:
        super().__init__(env)
        self.source = source
        space = env.single_action_space
        self.width = mask_width(space)
        if self.width is None:
            raise UsageError(
                f"{env.spec.id if env.spec else 'the env'} gives action masks, which rlstore "
                f"applies to Discrete and MultiDiscrete actions, not {space}; drop them with "
                "--action-masks off"
            )
        self.nvec = (
            [int(n) for n in space.nvec.reshape(-1)]
            if isinstance(space, gym.spaces.MultiDiscrete)
            else [self.width]
        )
        self.masks = np.ones((env.num_envs, self.width), dtype=bool)
        self._starts = np.cumsum([0, *self.nvec[:-1]])  # each sub-action's first entry

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, infos = self.env.reset(**kwargs)
        self.masks = self._read(infos, np.zeros(self.num_envs, dtype=bool))
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        self.masks = self._read(infos, terminated | truncated)
        return obs, rewards, terminated, truncated, infos

    def _read(self, infos: dict[str, Any], done: np.ndarray) -> np.ndarray:
        """The masks of this step's observations; an env that just ended need not allow an
        action (its next one is the ignored pseudo-step's), every other env must."""
        if self.source == "info":
            masks, given = infos.get(INFO_KEY), infos.get("_" + INFO_KEY)
            if masks is None or (given is not None and not np.all(given)):
                raise UsageError(NO_MASK_IN_INFO)
        else:
            masks = np.stack([np.asarray(m) for m in self.env.call("action_masks")])
        return self.checked(masks, done)

    def read_envs(self, envs: list[gym.Env], infos: list[dict[str, Any]], done: Any) -> np.ndarray:
        """_read for a vector env whose envs were stepped or reset outside it (the lean
        loops): the masks after that step of each of `envs`, whose infos were `infos` and
        which ended where `done`, kept as `masks` and returned."""
        if self.source == "info":
            masks = [info.get(INFO_KEY) for info in infos]
            if any(mask is None for mask in masks):
                raise UsageError(NO_MASK_IN_INFO)
        else:
            masks = [env.get_wrapper_attr("action_masks")() for env in envs]
        try:
            stacked = np.array(masks)  # (np.stack costs 8x more)
        except ValueError:  # of different shapes
            shapes = sorted({np.shape(mask) for mask in masks})
            raise UsageError(
                f"the envs' action masks differ in shape ({', '.join(map(str, shapes))}); "
                f"{self.single_action_space} needs {self.width} booleans per env"
            ) from None
        self.masks = self.checked(stacked, done)
        return self.masks

    def checked(self, masks: Any, done: np.ndarray) -> np.ndarray:
        """The envs' masks as booleans, checked: their shape and dtype, and an allowed
        action (per sub-action) for every env that is not `done`."""
        masks = np.asarray(masks)
        if masks.shape != (self.num_envs, self.width) or masks.dtype.kind not in "biu":
            raise UsageError(
                f"the env's action masks are {masks.dtype} of shape {masks.shape[1:]} per env; "
                f"{self.single_action_space} needs {self.width} booleans (or 0/1 integers), "
                "one per action" + (", sub-action by sub-action" if len(self.nvec) > 1 else "")
            )
        masks = masks.astype(bool)
        if len(self.nvec) == 1:
            allowed = masks.any(axis=1)
        else:
            allowed = np.logical_or.reduceat(masks, self._starts, axis=1).all(axis=1)
        if allowed.all():  # (the usual case, told at once)
            return masks
        stuck = ~allowed & ~np.asarray(done, dtype=bool)
        if stuck.any():
            env = int(np.flatnonzero(stuck)[0])
            raise UsageError(
                f"env {env}'s action mask allows no action at its observation (mask "
                f"{masks[env].astype(int).tolist()}); an env that is not done must allow one"
                + (" per sub-action" if len(self.nvec) > 1 else "")
            )
        return masks


def masks_of(envs: gym.vector.VectorEnv) -> ActionMasks | None:
    """The ActionMasks layer of a vector env's wrappers (None: the env gives no masks)."""
    while isinstance(envs, gym.vector.VectorWrapper):
        if isinstance(envs, ActionMasks):
            return envs
        envs = envs.env
    return None


def one_env_mask(env: gym.Env, info: dict[str, Any], source: str | None) -> np.ndarray | None:
    """The action mask of one env (not vectorized) at the observation it returned with
    `info`, as (1, width) bool (None: no masks)."""
    if source is None:
        return None
    mask = info[INFO_KEY] if source == "info" else env.get_wrapper_attr("action_masks")()
    return np.asarray(mask, dtype=bool)[None]


def with_action_masks(
    envs: gym.vector.VectorEnv, one_env: gym.Env, reset_info: dict[str, Any], option: str
) -> gym.vector.VectorEnv:
    """`envs` as ActionMasks when the env gives masks (seen on `one_env`, one of its kind,
    reset with `reset_info`) and `option` ("auto" or "off", --action-masks) uses them."""
    source = mask_source(one_env, reset_info) if option == "auto" else None
    return envs if source is None else ActionMasks(envs, source)
