"""`rlstore check-env ID`: an env tried the way training will take it, before a run is spent.

Gymnasium's own env checker first, then rlstore's: which algorithms can take its spaces
(and why not the others), the encoder and action head its spaces get, where its action
masks come from, whether hindsight replay can relabel it, whether a resumed run continues
it bit for bit, and random steps through the env boundary's checks (rlstore/env_checks.py)
with their speed. One screen; exit 0 when training can start, 2 when it cannot.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlstore import algos
from rlstore.custom_envs import EnvMaker, parse_env_kwargs
from rlstore.encoders import describe_space, takes_nature_cnn
from rlstore.env_snapshots import saves_state
from rlstore.envs import check_env_id, check_spaces
from rlstore.errors import UsageError
from rlstore.goals import hindsight_for, is_goal_space
from rlstore.masks import MASK_SOURCES, mask_source, mask_width, one_env_mask
from rlstore.text import plural

ENCODERS = {
    "box": "a flat vector into the MLP",
    "discrete": "one-hot",
    "multi_discrete": "one-hot per entry",
    "multi_binary": "0/1 floats",
}
HEADS = {
    spaces.Discrete: "a categorical over {n} actions (PPO, A2C, ppo_lstm) or {n} Q-values",
    spaces.Box: "a Gaussian (PPO, A2C, SAC, TQC, CrossQ) or a deterministic actor (TD3, DDPG)",
    spaces.MultiDiscrete: "a categorical per sub-action (PPO, A2C, ppo_lstm)",
    spaces.MultiBinary: "a Bernoulli per bit (PPO, A2C, ppo_lstm)",
}


def check_env(
    env_id: str,
    env_kwargs: Sequence[str] = (),
    wrappers: Sequence[str] = (),
    drop_obs_keys: Sequence[str] = (),
    steps: int = 300,
    seed: int = 0,
) -> int:
    """Check the env and print what training would make of it; 0 when training can start,
    2 when it cannot (what stops it is a UsageError's one line)."""
    if steps < 1:
        raise UsageError(f"--steps must be at least 1 (got {steps})")
    spec = check_env_id(env_id)
    maker = EnvMaker(spec.id, parse_env_kwargs(env_kwargs), wrappers, drop_obs_keys)
    maker.check()  # (constructor arguments and wrappers: one line each)
    print(f"rlstore check-env: {env_id}")
    say("gymnasium's env checker", gymnasium_checker(maker))
    env = maker()
    try:
        obs_space, action_space = env.observation_space, env.action_space
        check_spaces(env_id, None, obs_space, action_space)  # (spaces no algorithm takes)
        for line in encoder_lines(obs_space):
            say("observation", line)
        head = next(text for kind, text in HEADS.items() if isinstance(action_space, kind))
        head = head.format(n=getattr(action_space, "n", ""))
        say("action", f"{short(action_space)}: {head}")
        say("algorithms", algorithm_lines(env_id, obs_space, action_space))
        _, info = env.reset(seed=seed)
        source = mask_source(env, info) if mask_width(action_space) else None
        say("action masks", f"from {MASK_SOURCES[source]}" if source else "none given")
        say("hindsight (--her)", hindsight_line(env, env_id))
        say(
            "resume",
            "bit for bit: its state goes into checkpoints"
            if saves_state(env, spec)
            else "with freshly reset envs (rlstore cannot save this env's state)",
        )
        say(f"{plural(steps, 'random step')}", random_steps(env, steps, seed, source))
    finally:
        env.close()
    print(f"rlstore check-env: {env_id} can be trained (rlstore train ALGO --env {env_id})")
    return 0


def say(what: str, text: str) -> None:
    print(f"  {what}: {text}")


def gymnasium_checker(maker: EnvMaker) -> str:
    """What gymnasium.utils.env_checker.check_env says of the env (it does not decide
    whether rlstore can train it: a non-deterministic reset, say, still trains)."""
    from gymnasium.utils.env_checker import check_env as gymnasium_check_env

    env = maker()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gymnasium_check_env(env.unwrapped, skip_render_check=True)
    except Exception as e:  # (its assertions, and what the env raises under them)
        return f"it found {first_line(e)}"
    finally:
        env.close()
    notes = list(dict.fromkeys(first_line(w.message) for w in caught))
    if not notes:
        return "passed"
    return f"passed, with {plural(len(notes), 'warning')}: " + "; ".join(notes[:3])


def first_line(message: Any) -> str:
    """The first line of a message, without terminal colours or Gymnasium's prefix; an
    exception's with its type."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(message)).strip()
    text = text.splitlines()[0] if text else ""
    if isinstance(message, Exception):
        text = f"{type(message).__name__}: {text}" if text else type(message).__name__
    return text.removeprefix("WARN: ")[:160]


def short(space: gym.Space) -> str:
    """A space in a few words (a Box's bounds left out)."""
    if isinstance(space, spaces.Box):
        return f"Box{space.shape} {space.dtype}"
    return str(space)


def encoder_lines(space: gym.Space, name: str = "obs") -> list[str]:
    """The encoder each part of the observation gets, one line a part."""
    description = describe_space(space)
    kind = description["type"]
    if kind in ("dict", "tuple"):
        named = space.spaces.items() if kind == "dict" else enumerate(space.spaces)
        return [line for key, part in named for line in encoder_lines(part, f"{name}[{key!r}]")]
    if kind == "image":
        cnn = "the Nature CNN" if takes_nature_cnn(tuple(space.shape)) else "a small CNN"
        return [f"{name} {short(space)}: an image, kept uint8, into {cnn}"]
    return [f"{name} {short(space)}: {ENCODERS[kind]}"]


def algorithm_lines(env_id: str, obs_space: gym.Space, action_space: gym.Space) -> str:
    """Which algorithms take the spaces, and why not the others."""
    takes: list[str] = []
    refused: dict[str, list[str]] = {}  # why -> the algorithms refused so
    for algorithm in algos.all_algorithms():
        try:
            check_spaces(env_id, algorithm, obs_space, action_space)
        except UsageError as e:
            why = str(e).split(";")[0].replace(f"{algorithm.name.upper()} ", "", 1)
            refused.setdefault(why, []).append(algorithm.name)
        else:
            takes.append(algorithm.name)
    text = ", ".join(takes) if takes else "none"
    return text + "".join(f"; not {', '.join(names)}: {why}" for why, names in refused.items())


def hindsight_line(env: gym.Env, env_id: str) -> str:
    if not is_goal_space(env.observation_space):
        return "no: not a goal-conditioned env (a Dict of observation, achieved_goal, desired_goal)"
    try:
        hindsight_for(env, env_id, 4, "future")
    except UsageError as e:
        return f"no: {e}"
    return "yes: a goal env whose compute_reward takes arrays of goals"


def random_steps(env: gym.Env, steps: int, seed: int, mask: str | None) -> str:
    """`steps` random actions (allowed ones, under masks) through the env boundary's
    checks: what they found, episodes and speed."""
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    obs, info = env.reset(seed=seed)
    episodes, start = 0, time.perf_counter()
    for step in range(steps):
        try:
            allowed = one_env_mask(env, info, mask)
            sample = masked_sample(env, allowed, rng) if allowed is not None else None
            action = env.action_space.sample() if sample is None else sample
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                episodes += 1
                obs, info = env.reset()
        except UsageError:
            raise
        except Exception as e:  # the env's own error: what training would meet
            raise UsageError(
                f"at random step {step + 1} the env raised {type(e).__name__}: {first_line(e)}"
            ) from None
    rate = steps / max(time.perf_counter() - start, 1e-9)
    return (
        f"what it returned fits its spaces; {plural(episodes, 'episode')} ended, "
        f"{rate:,.0f} steps/s"
    )


def masked_sample(env: gym.Env, allowed: np.ndarray, rng: np.random.Generator) -> Any:
    """A random action the mask allows (per sub-action for MultiDiscrete; None where it
    allows none, at an episode's end)."""
    space = env.action_space
    if not allowed.any():
        return None
    if isinstance(space, spaces.Discrete):
        return int(space.start + rng.choice(np.flatnonzero(allowed[0])))
    nvec = space.nvec.reshape(-1)
    offsets = np.cumsum([0, *nvec[:-1]])
    values = [
        rng.choice(np.flatnonzero(allowed[0, o : o + n]))
        for o, n in zip(offsets, nvec, strict=True)
    ]
    start = np.broadcast_to(space.start, space.shape).reshape(-1)
    return (np.asarray(values) + start).reshape(space.shape)
