"""Vector environments and the autoreset contract (docs/reference/episode-boundaries.md).

rlstore uses Gymnasium's NEXT_STEP autoreset mode (the default, and the only mode the
native vectorized envs such as CartPoleVectorEnv implement). Its consequences:

- the observation returned with a done step IS the final observation of the episode, so a
  truncated step bootstraps from V(next observation) with no special casing;
- the step after a done is a pseudo-step (action ignored, reward 0, reset observation):
  RolloutStorage marks it invalid and it never becomes a transition, and EpisodeStats does
  not count it.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from rlstore.atari import is_atari, make_atari_envs
from rlstore.bit_flipping import register as register_bit_flipping
from rlstore.config import CommonConfig
from rlstore.custom_envs import (
    EnvMaker,
    callable_env,
    import_user_module,
    parse_env_kwargs,
    wrap,
)
from rlstore.encoders import UnsupportedSpace, describe_space, has_image
from rlstore.env_snapshots import WORKER_ACCESS, EpisodeRecorder, WorkerAccess, replayed
from rlstore.errors import UsageError
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.masks import ActionMasks, mask_source
from rlstore.partially_observable import register as register_partially_observable

if TYPE_CHECKING:
    from rlstore.algos import Algorithm

register_partially_observable()  # CartPoleNoVel-v1, PendulumNoVel-v1
register_bit_flipping()  # BitFlipping-v0

# Gymnasium-Robotics' id prefixes: it registers them when imported
ROBOTICS_PREFIXES = (
    "Fetch",
    "PointMaze",
    "AntMaze",
    "HandManipulate",
    "HandReach",
    "AdroitHand",
    "FrankaKitchen",
)

# Env families that need an optional dependency: (entry-point module prefix or id
# prefix, what it needs, the rlstore extra that installs it).
EXTRAS = (
    ("gymnasium.envs.box2d", "Box2D", "box2d"),
    ("gymnasium.envs.mujoco", "MuJoCo", "mujoco"),
    ("ALE/", "ale-py (the Atari emulator)", "atari"),
    ("MiniGrid-", "minigrid", "minigrid"),
    ("BabyAI-", "minigrid", "minigrid"),
    *((prefix, "gymnasium-robotics", "robotics") for prefix in ROBOTICS_PREFIXES),
    ("gymnasium_robotics", "gymnasium-robotics", "robotics"),
)


def missing_extra(name: str) -> str:
    """The one-line error for an env whose optional dependency is not installed."""
    for prefix, needs, extra in EXTRAS:
        if name.startswith(prefix):
            return (
                f'needs {needs}, which is not installed: pip install "rlstore[{extra}]" '
                f'(in a clone: pip install -e ".[{extra}]")'
            )
    return "needs a package that is not installed"


def check_env_id(env_id: str) -> gym.envs.registration.EnvSpec:
    """The env's spec, or a UsageError that suggests close matches or the missing extra."""
    if ":" in env_id:  # "module:EnvId" registers its envs on import, as gym.make does
        module, _, env_id = env_id.partition(":")
        try:
            import_user_module(module)
        except ImportError as e:
            raise UsageError(
                f"cannot import module '{module}' named in the env id ({e}); install it or "
                "run from the directory that holds it"
            ) from None
        if env_id not in gym.registry:  # or "module:function", a function that makes the env
            env_id = callable_env(module, env_id) or env_id
    if env_id not in gym.registry:  # maybe an Atari id: ale-py registers them on import
        try:
            gym.register_envs(importlib.import_module("ale_py"))
        except ImportError:
            if env_id.startswith("ALE/") or "NoFrameskip" in env_id:
                raise UsageError(f"{env_id} {missing_extra('ALE/')}") from None
    if env_id not in gym.registry and env_id.startswith(("MiniGrid-", "BabyAI-")):
        try:  # minigrid registers its ids on import
            importlib.import_module("minigrid")
        except ImportError:
            raise UsageError(f"{env_id} {missing_extra(env_id)}") from None
    if env_id not in gym.registry and env_id.startswith(ROBOTICS_PREFIXES):
        try:
            gym.register_envs(importlib.import_module("gymnasium_robotics"))
        except ImportError:
            raise UsageError(f"{env_id} {missing_extra(env_id)}") from None
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        hint = hint or "; see gymnasium.pprint_registry()"
        raise UsageError(
            f"unknown env id '{env_id}'{hint} (an env of your own: --env module:EnvId, or "
            "module:make_env for a function that returns it; docs/guides/custom-envs.md)"
        )
    spec = gym.spec(env_id)
    if isinstance(spec.entry_point, str):  # its module imports the optional dependency
        module = spec.entry_point.partition(":")[0]
        try:
            importlib.import_module(module)
        except (ImportError, gym.error.DependencyNotInstalled):
            raise UsageError(f"{env_id} {missing_extra(module)}") from None
    return spec


def route_mujoco_warnings(spec: gym.envs.registration.EnvSpec) -> None:
    """Send MuJoCo's warnings to Python's `warnings`, where the user has not set a handler of
    their own. Left alone, MuJoCo prints each one and appends it to MUJOCO_LOG.TXT in the
    working directory, for every env built: from MuJoCo 3.5 on, Gymnasium's
    half_cheetah.xml draws a deprecation warning at each load. As a Python warning it is
    shown once and no file is written."""
    if not str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        return
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_warn_from_mujoco)


def _warn_from_mujoco(message: str) -> None:
    warnings.warn(f"MuJoCo: {message}", RuntimeWarning, stacklevel=2)


def check_spaces(
    env_id: str, algorithm: Algorithm | None, obs_space: gym.Space, action_space: gym.Space
) -> None:
    """What rlstore can train on: observations with an encoder (rlstore/encoders.py: Box
    vectors of any shape, images, Discrete, MultiDiscrete, MultiBinary, and Dicts and
    Tuples of those), and the action spaces `algorithm` takes (None: any algorithm's:
    Discrete, a 1-d Box, MultiDiscrete, MultiBinary)."""
    try:
        describe_space(obs_space)
    except UnsupportedSpace as e:
        key = re.fullmatch(r"\['([^']*)'\]", e.part)  # a top-level Dict key
        fix = (
            f"leave it out with --drop-obs-keys {key[1]}"
            if key
            else "turn them into ones it takes with --wrapper module:Callable"
        )
        raise UsageError(
            f"{env_id}: {e} (it takes Box, Discrete, MultiDiscrete and MultiBinary "
            f"observations, and Dicts and Tuples of them); {fix}"
        ) from None
    if algorithm is not None and has_image(obs_space) and not algorithm.image_observations:
        others = algorithm.names_of(lambda a: a.image_observations)
        raise UsageError(
            f"{algorithm.name.upper()} takes vector observations, not images such as those "
            f"in {env_id}'s {obs_space}; images train with {', '.join(others)}"
        )
    if algorithm is not None and not algorithm.takes(action_space):
        kinds = " or ".join(kind.__name__ for kind in algorithm.action_spaces)
        others = algorithm.names_of(lambda a: a.takes(action_space))
        offer = f"; use `rlstore train {others[0]}`" if others else ""
        offer += "".join(f" or `rlstore train {name}`" for name in others[1:])
        raise UsageError(
            f"{algorithm.name.upper()} needs a {kinds} action space; {env_id} has "
            f"{action_space}{offer}"
        )
    box_1d = isinstance(action_space, spaces.Box) and len(action_space.shape) == 1  # (any
    # other Box is flattened by custom_envs.wrap)
    several = isinstance(action_space, (spaces.MultiDiscrete, spaces.MultiBinary))
    if not (isinstance(action_space, spaces.Discrete) or box_1d or several):
        raise UsageError(
            f"{env_id} has action space {action_space}; rlstore takes Discrete, 1-d Box, "
            "MultiDiscrete and MultiBinary actions"
        )


def is_frame_stack(obs_space: gym.Space) -> bool:
    """Whether observations are channel-first uint8 image stacks, which the Nature CNN takes
    (at least 36x36: smaller frames vanish in its convolutions)."""
    shape = getattr(obs_space, "shape", None) or ()
    return (
        isinstance(obs_space, spaces.Box)
        and obs_space.dtype == np.uint8
        and len(shape) == 3
        and shape[0] <= 16
        and min(shape[1:]) >= 36
    )


# A native vector step costs about the same for 1 or 16 envs, where the lean sync step pays
# per env: below 6 CartPole envs sync is faster (docs/maintainers/fast-paths.md).
NATIVE_MIN_ENVS = 6


def make_vec_env(
    env_id: str,
    num_envs: int,
    seed: int,
    vectorization: str = "auto",
    max_episode_steps: int | None = None,
    algorithm: Algorithm | None = None,
    infos: bool = True,
    sticky_actions: bool = False,
    fire_on_life_loss: bool = False,
    lean: bool = True,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[str] = (),
    drop_obs_keys: Sequence[str] = (),
    action_masks: str = "off",
    check_finite: bool = True,
) -> gym.vector.VectorEnv:
    """Build `num_envs` copies of `env_id` as one NEXT_STEP-autoreset vector env, after
    checking that `algorithm` can train on its spaces (check_spaces).

    vectorization: "auto" takes the env's own vectorized implementation
    (`vector_entry_point`) when it has one and num_envs >= NATIVE_MIN_ENVS, and "sync"
    otherwise; "native", "sync" and "async" force a mode. The action space is seeded
    here; the envs are seeded by the first `reset(seed=seed)`, which the caller does.
    `infos=False` lets the sync vector env skip gathering step infos (training reads none).
    "sync" is LeanSyncVectorEnv (a fast path), or with `lean=False` Gymnasium's own
    SyncVectorEnv.
    Atari games get their standard preprocessing and `life_lost` (rlstore/atari.py).
    `env_kwargs` go to each env's constructor and `wrappers` ("module:Callable") wrap each
    env in order (rlstore/custom_envs.py), then `drop_obs_keys` leaves keys out of its
    Dict observations; an env wrapped so is stepped one by one (sync or async), not by a
    native vector env. `action_masks` "auto": where the env gives action masks, the vector
    env is an ActionMasks (rlstore/masks.py), whose `masks` are its envs' current ones.
    Each env stepped one by one checks what it returns against its spaces
    (rlstore/env_checks.py; `check_finite`: NaN and inf too).
    """
    spec = check_env_id(env_id)
    route_mujoco_warnings(spec)
    env_kwargs = env_kwargs or {}
    if is_atari(spec) and (env_kwargs or wrappers or drop_obs_keys):
        raise UsageError(
            f"--env-kwargs, --wrapper and --drop-obs-keys do not apply to Atari games yet "
            f"({env_id} gets rlstore's own preprocessing, docs/guides/atari.md); drop them"
        )
    maker = EnvMaker(
        spec.id, env_kwargs, wrappers, drop_obs_keys, check_finite, **time_limit(max_episode_steps)
    )
    if env_kwargs or maker.wrapped:  # one env first: its mistakes as one line, before copies
        maker.check()
    masks = None if action_masks == "off" or is_atari(spec) else mask_source_of(maker, seed)
    infos = infos or masks == "info"
    if is_atari(spec):
        envs = make_atari_envs(
            spec, num_envs, vectorization, sticky_actions, max_episode_steps, fire_on_life_loss
        )
    else:
        envs = _make_gymnasium_vec_env(spec, num_envs, vectorization, infos, lean, maker)
    try:
        check_spaces(env_id, algorithm, envs.single_observation_space, envs.single_action_space)
    except UsageError:
        envs.close()
        raise
    if masks is not None:
        envs = ActionMasks(envs, masks)
    mode_of_envs = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    assert mode_of_envs == AutoresetMode.NEXT_STEP, (
        f"rlstore needs NEXT_STEP autoreset, {env_id} uses {mode_of_envs}"
    )
    envs.action_space.seed(seed)
    envs.single_action_space.seed(seed)
    return envs


def time_limit(max_episode_steps: int | None) -> dict[str, Any]:
    """gym.make's keyword for a time limit of its own (none: the env's)."""
    return {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}


def _env_fn(spec: gym.envs.registration.EnvSpec, make: EnvMaker) -> Any:
    """What makes one env of `spec`: `make`, wrapped in an EpisodeRecorder where its
    episodes replay."""
    return (lambda: EpisodeRecorder(make())) if replayed(spec) else make


def _make_gymnasium_vec_env(
    spec: gym.envs.registration.EnvSpec,
    num_envs: int,
    vectorization: str,
    infos: bool,
    lean: bool,
    maker: EnvMaker,
) -> gym.vector.VectorEnv:
    if vectorization == "auto":
        native = spec.vector_entry_point is not None and num_envs >= NATIVE_MIN_ENVS
        mode = "vector_entry_point" if native and not maker.wrapped else "sync"
    elif vectorization == "native":
        if spec.vector_entry_point is None or maker.wrapped:
            why = (
                "with --wrapper, envs are wrapped one by one"
                if maker.wrapped
                else ("it has no native vectorized implementation")
            )
            raise UsageError(
                f"--vectorization native cannot build {spec.id}: {why}; "
                "use --vectorization sync or async"
            )
        mode = "vector_entry_point"
    else:
        mode = vectorization
    if mode == "sync" and lean:
        env_fns = [_env_fn(spec, maker)] * num_envs
        try:
            return LeanSyncVectorEnv(env_fns, infos)
        except TypeError:  # observations it does not handle: rlstore refuses them later
            return gym.vector.SyncVectorEnv(env_fns)
    # each env through wrap, a picklable call (async workers get it): the user's wrappers,
    # dropped keys, Box actions of more than one dimension flattened; a native vector env
    # takes no wrappers (refused above when the user gave some)
    native = mode == "vector_entry_point"
    layers = (
        []
        if native
        else [
            functools.partial(
                wrap,
                wrappers=maker.wrappers,
                drop_keys=maker.drop_keys,
                check_finite=maker.check_finite,
            )
        ]
    )
    layers += [EpisodeRecorder] if mode in ("sync", "async") and replayed(spec) else []
    if mode == "async":
        layers.append(WorkerAccess)
    envs = gym.make_vec(
        spec.id,
        num_envs=num_envs,
        vectorization_mode=mode,
        wrappers=layers,
        **maker.make_kwargs,
        **maker.env_kwargs,
    )
    if mode == "async":  # (a copy: the class's own dict is shared)
        envs.metadata = {**envs.metadata, WORKER_ACCESS: True}
    return envs


def mask_source_of(maker: EnvMaker, seed: int) -> str | None:
    """How the env `maker` makes gives action masks (rlstore/masks.py), seen on one env."""
    env = maker()
    try:
        _, info = env.reset(seed=seed)
        return mask_source(env, info)
    finally:
        env.close()


def check_atari_options(cfg: CommonConfig) -> None:
    """The Atari-only options are refused elsewhere (they would do nothing there)."""
    for name in ("sticky_actions", "fire_on_life_loss"):
        if getattr(cfg, name) and not is_atari(check_env_id(cfg.env_id)):
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} applies to Atari games only and {cfg.env_id} is not one; drop it"
            )


def make_training_envs(cfg: CommonConfig, algorithm: Algorithm) -> gym.vector.VectorEnv:
    """The vector env of a training run of `algorithm`, as its config says (no step infos:
    training reads none)."""
    check_atari_options(cfg)
    masks = cfg.action_masks if algorithm.action_masks else "off"
    envs = make_vec_env(
        cfg.env_id,
        cfg.num_envs,
        cfg.seed,
        cfg.vectorization,
        cfg.max_episode_steps,
        algorithm,
        infos=False,
        sticky_actions=cfg.sticky_actions,
        fire_on_life_loss=cfg.fire_on_life_loss,
        lean=cfg.use_fast_paths,
        env_kwargs=parse_env_kwargs(cfg.env_kwargs),
        wrappers=cfg.wrapper,
        drop_obs_keys=cfg.drop_obs_keys,
        action_masks=masks,
        check_finite=cfg.check_finite == "on",
    )
    envs = TruncationAsTermination(envs) if cfg.truncation_as_termination else envs
    space = envs.single_action_space
    return DiscreteFromZero(envs) if isinstance(space, spaces.Discrete) and space.start else envs


class StartedDiscrete(spaces.Discrete):
    """Discrete(n) for the algorithms, of an env whose actions are `env_start` +
    0..n-1: saved policies give the env's own actions (policy_spec's action_start)."""

    def __init__(self, space: spaces.Discrete) -> None:
        super().__init__(int(space.n))
        self.env_start = int(space.start)


class DiscreteFromZero(gym.vector.VectorWrapper):
    """A Discrete(n, start=s) action space as Discrete(n): the algorithms act in 0..n-1,
    which this shifts by s for the envs. (Evaluation envs are not wrapped: they take a
    saved policy's actions, which are the env's own.)"""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.start = int(env.single_action_space.start)
        self.single_action_space = StartedDiscrete(env.single_action_space)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, env.num_envs)

    def step(self, actions: Any) -> tuple[Any, ...]:
        return self.env.step(np.asarray(actions) + self.start)


class TruncationAsTermination(gym.vector.VectorWrapper):
    """Reports every truncation as a termination (--truncation-as-termination): learners
    then cut the bootstrap at time limits, as some published code does. Episodes still end
    where they ended; only the flag changes."""

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        return obs, reward, terminated | truncated, np.zeros_like(truncated), info
