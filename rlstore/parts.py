"""Observations made of parts (Gymnasium's Dict and Tuple spaces), as trees.

A tree is one array or tensor (a Box, Discrete, ... observation: one part), or a dict or a
tuple of trees, as Gymnasium's vector envs batch Dict and Tuple observations. The storages
keep each part in a tensor of its own dtype (uint8 images stay uint8), and the encoders
take the same trees; these helpers walk them so that nothing else branches on the space.

Shapes and dtypes are given as trees too: a shape is a tuple of ints (`()` for a scalar),
so `{"image": (7, 7, 3), "direction": ()}` and `((), (), ())` are trees of shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

Tree = Any  # an array or tensor, or a dict or tuple of trees


def is_shape(x: Any) -> bool:
    """Whether x is one shape (a tuple of ints), not a tree of shapes."""
    return isinstance(x, tuple) and all(isinstance(d, (int, np.integer)) for d in x)


def map_shapes(fn: Callable[..., Any], shapes: Tree, *trees: Tree) -> Tree:
    """fn(shape, *parts) for each shape of a tree of shapes; the other trees (dtypes, or
    anything of the same structure) are read by the same keys, or used whole where they
    are not a container (one dtype for every part)."""
    if is_shape(shapes):
        return fn(tuple(int(d) for d in shapes), *trees)

    def part(tree: Tree, key: Any) -> Tree:
        return tree[key] if isinstance(tree, (dict, tuple, list)) else tree

    if isinstance(shapes, Mapping):
        return {k: map_shapes(fn, s, *(part(t, k) for t in trees)) for k, s in shapes.items()}
    return tuple(map_shapes(fn, s, *(part(t, i) for t in trees)) for i, s in enumerate(shapes))


def shape_leaves(shapes: Tree) -> list[tuple[int, ...]]:
    """The shapes of a tree of shapes, in order."""
    found: list[tuple[int, ...]] = []
    map_shapes(found.append, shapes)
    return found


def map_parts(fn: Callable[..., Any], tree: Tree, *others: Tree) -> Tree:
    """fn(part, *other parts) for each part of `tree`; the other trees have its structure."""
    if isinstance(tree, dict):
        return {k: map_parts(fn, v, *(o[k] for o in others)) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(map_parts(fn, v, *(o[i] for o in others)) for i, v in enumerate(tree))
    return fn(tree, *others)


def check_parts(check: Callable[[Any, str, Any], Any], given: Tree, mine: Tree, name: str) -> Tree:
    """check(given part, its name, my part) for each part of `mine`, reading the `given`
    tree (a user's input) by the same keys; the checked tree. A given tree of another
    structure is a ValueError that names the part."""
    if isinstance(mine, dict):
        if not isinstance(given, Mapping) or set(given) != set(mine):
            got = sorted(given) if isinstance(given, Mapping) else type(given).__name__
            raise ValueError(f"{name} must be a dict with keys {sorted(mine)}, got {got}")
        return {k: check_parts(check, given[k], v, f"{name}[{k!r}]") for k, v in mine.items()}
    if isinstance(mine, tuple):
        if not isinstance(given, (tuple, list)) or len(given) != len(mine):
            raise ValueError(f"{name} must be a tuple of {len(mine)} parts")
        return tuple(
            check_parts(check, g, v, f"{name}[{i}]")
            for i, (g, v) in enumerate(zip(given, mine, strict=True))
        )
    return check(given, name, mine)


def take(tree: Tree, index: Any) -> Tree:
    """part[index] of each part."""
    return map_parts(lambda part: part[index], tree)


def leaves(tree: Tree) -> list[Any]:
    """The parts of a tree, in order (for a tree of shapes, map_shapes)."""
    if not isinstance(tree, (dict, tuple)):
        return [tree]
    values = tree.values() if isinstance(tree, dict) else tree
    return [leaf for value in values for leaf in leaves(value)]


def first_part(tree: Tree) -> Any:
    """The first part of a tree (its batch size is every part's)."""
    return leaves(tree)[0]


def as_tensors(tree: Tree, device: torch.device | str | None = None) -> Tree:
    """torch.as_tensor of each part."""
    return map_parts(lambda x: torch.as_tensor(x, device=device), tree)


def to_numpy(tree: Tree) -> Tree:
    """Each part as a numpy array (host copies of tensors)."""
    return map_parts(
        lambda x: x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x), tree
    )
