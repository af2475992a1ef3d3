"""Observation layouts for the storage tests: the same test runs with plain Box
observations and with observations made of parts (a Dict holding a Tuple, each part in
its own dtype), so the episode-boundary oracles hold for every part, not copied per space.

An observation is encoded from a float vector `vec` (B, width): the "box" layout is `vec`
itself; the "parts" layout is `{"vec": vec, "more": (pixels, code)}`, where the uint8
pixels and the int64 code are functions of vec[:, 0]. `decode` gives vec back after
checking that every part agrees with it: a part taken from another slot than the others
(another step, env or episode) fails there."""

import numpy as np
import torch

LAYOUTS = ["box", "parts"]


def shape(layout: str, width: int):
    return (width,) if layout == "box" else {"vec": (width,), "more": ((2, 3), ())}


def dtype(layout: str):
    return np.float32 if layout == "box" else {"vec": np.float32, "more": (np.uint8, np.int64)}


def _key(first: np.ndarray) -> np.ndarray:
    return np.floor(np.abs(first) * 10).astype(np.int64)


def _pixels(first: np.ndarray) -> np.ndarray:
    return ((_key(first)[:, None, None] * 7 + np.arange(6).reshape(2, 3)) % 251).astype(np.uint8)


def _code(first: np.ndarray) -> np.ndarray:
    return _key(first) % 5


def encode(layout: str, vec: np.ndarray):
    vec = np.asarray(vec, dtype=np.float32)
    if layout == "box":
        return vec
    return {"vec": vec, "more": (_pixels(vec[:, 0]), _code(vec[:, 0]))}


def _numpy(x) -> np.ndarray:
    return x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def decode(layout: str, obs) -> np.ndarray:
    """vec of a batch of observations, after checking that every part agrees with it."""
    if layout == "box":
        return _numpy(obs)
    vec = _numpy(obs["vec"])
    pixels, code = (_numpy(part) for part in obs["more"])
    assert pixels.dtype == np.uint8 and code.dtype == np.int64
    np.testing.assert_array_equal(pixels, _pixels(vec[:, 0]))
    np.testing.assert_array_equal(code, _code(vec[:, 0]))
    return vec


def tensors_equal(a, b) -> bool:
    """Whether two trees of tensors (or tensors) are equal, part by part."""
    if a is None or b is None:
        return a is b
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)
