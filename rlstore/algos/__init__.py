"""The algorithms, one file each, and the registry that the rest of rlstore reads them from.

Every module in this package whose name does not start with "_" is an algorithm: it
defines `ALGORITHM = Algorithm(...)`, which says everything the command line, configs,
env checks, evaluation and the executors need to know about it. Nothing outside this
package names an algorithm. An algorithm defined elsewhere registers itself with
`register(Algorithm(...))` when its module is imported; list such modules in the
environment variable RLSTORE_ALGORITHMS (comma-separated) so that `rlstore` and the
child processes of `rlstore benchmark` and `rlstore sweep` import them
(docs/maintainers/layout.md, "Adding an algorithm").

This module imports neither torch nor gymnasium: `rlstore --help` lists the algorithms
from their file names without loading them.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlstore.errors import UsageError

if TYPE_CHECKING:
    from rlstore.config import CommonConfig

PLUGINS = "RLSTORE_ALGORITHMS"  # modules to import for algorithms defined outside rlstore


@dataclass(frozen=True)
class Algorithm:
    """What rlstore needs to know about an algorithm.

    name: the command (`rlstore train NAME`) and the name in run directories and records;
    summary: one line for `rlstore train --help`;
    config: its config dataclass (a CommonConfig), which is also its command line;
    train: `train(cfg, preset=None, resume=None, callbacks=()) -> TrainResult`;
    action_spaces: the action space classes it can act in (gymnasium.spaces.Discrete, Box);
    networks: the network classes its model.pt may hold; each has a SPEC_NAME, a
      `spec_args()` and a `from_spec(spec)` (rlstore/networks.py), from which `rlstore eval`
      and `load_policy` rebuild the policy;
    defaults: where its config's defaults come from, which a run without a preset says
      when it starts ("" says nothing);
    image_observations: whether it trains on images (uint8, three dimensions) through a
      CNN encoder; SAC's, TD3's and DDPG's actors and critics share a parameter-free one;
    action_masks: whether it acts under the action masks an env gives (rlstore/masks.py).
    """

    name: str
    summary: str
    config: type[CommonConfig]
    train: Callable[..., Any]
    action_spaces: tuple[type, ...]
    networks: tuple[type, ...]
    defaults: str = ""
    image_observations: bool = True
    action_masks: bool = False

    def build_policy(self, spec: dict[str, Any]) -> Any:
        """The network a policy spec of this algorithm describes, with fresh parameters."""
        for network in self.networks:
            if spec["network"] == network.SPEC_NAME:
                return network.from_spec(spec)
        raise ValueError(
            f"the model file holds a '{spec['network']}' network, which {self.name} does not "
            f"build (it builds {', '.join(n.SPEC_NAME for n in self.networks)})"
        )

    def takes(self, action_space: Any) -> bool:
        """Whether it can act in `action_space`."""
        return isinstance(action_space, self.action_spaces)

    @staticmethod
    def names_of(which: Callable[[Algorithm], bool]) -> list[str]:
        """The names of the algorithms `which` holds for (loaded), for the messages of the
        modules that are given an Algorithm and do not import the registry (envs.py)."""
        return [algorithm.name for algorithm in all_algorithms() if which(algorithm)]


_registered: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    """Add an algorithm defined outside rlstore/algos (a second one of the same name
    replaces the first: a module imported again registers again)."""
    _registered[algorithm.name] = algorithm
    return algorithm


def builtin_names() -> list[str]:
    """The algorithms in this package, from their file names (nothing is imported)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _import_plugins() -> None:
    for module in filter(None, (m.strip() for m in os.environ.get(PLUGINS, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UsageError(
                f"{PLUGINS} names module '{module}', which cannot be imported ({e})"
            ) from None


def names() -> list[str]:
    """Every algorithm: those in this package, then those registered or named in
    RLSTORE_ALGORITHMS (imported here)."""
    _import_plugins()
    builtin = builtin_names()
    return builtin + sorted(set(_registered) - set(builtin))


def get(name: str) -> Algorithm:
    """The algorithm called `name` (its module is imported on first use), or a UsageError
    that offers the close names."""
    if name in _registered:
        return _registered[name]
    if name in builtin_names():
        return register(importlib.import_module(f"{__name__}.{name}").ALGORITHM)
    _import_plugins()
    if name in _registered:
        return _registered[name]
    known = names()
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    outside = "" if close else f" (one defined outside rlstore: name its module in {PLUGINS})"
    raise UsageError(f"unknown algorithm '{name}'; {hint}choose one of {', '.join(known)}{outside}")


def all_algorithms() -> list[Algorithm]:
    """Every algorithm, loaded."""
    return [get(name) for name in names()]
