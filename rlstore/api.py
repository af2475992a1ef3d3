"""`rlstore.train(algo, env=..., **config)`: a run from Python in one call, as SB3's users
write `PPO("MlpPolicy", env).learn(...)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlstore import algos
from rlstore.custom_envs import env_id_of
from rlstore.presets import resolve
from rlstore.run import TrainResult


def train(
    algo: str,
    env: str | Callable[..., Any] | None = None,
    pickle_env: bool = False,
    **config: Any,
) -> TrainResult:
    """Train `algo` ("ppo", "dqn", ...) on `env` and return the run's result (run dir,
    episode returns, model).

    env: an env id ("CartPole-v1", "my_module:MyEnv-v0") or a function defined at the top
    of a module that returns a new env (one is made per parallel env; the run records it
    as "module:function", so `rlstore eval` and resume find it again). Default: the
    algorithm's default env.
    pickle_env: an env that no later process can import (a function defined in the script,
    a lambda, a partial, an id the script registers) is refused before training, unless
    this saves it with the run as code (env.pkl, cloudpickle): `rlstore eval` and `rlstore
    resume` then load it with --trust-env-code, since loading it runs that code.
    config: fields of the algorithm's config (`total_timesteps=50_000`, `env_kwargs=
    ("is_slippery=False",)`), over the env's preset, as flags are on the command line.
    """
    overrides = dict(config)
    if env is not None:
        overrides["env_id"] = env_id_of(env, pickle_env)
    cfg, preset = resolve(algo, overrides.get("env_id"), overrides)
    return algos.get(algo).train(cfg, preset)
