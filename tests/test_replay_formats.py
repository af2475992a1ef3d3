"""Replay buffers saved by an earlier rlstore load and go on as they would have: each file in
tests/fixtures/replay was written by the code of its time (tests/replay_fixtures.py), with
the two batches that buffer sampled next; the code under test must sample the same."""

import numpy as np
import pytest
import torch

from rlstore.files import safe_load
from tests.replay_fixtures import CASES, FOLDER, batches, build


def same(a, b, where="") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor | np.ndarray):
        x, y = torch.as_tensor(a), torch.as_tensor(b)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), where
    else:
        assert a == b, where


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_saved_buffer_samples_what_it_sampled_when_saved(name):
    buffer = build(name)
    buffer.load(FOLDER / f"{name}.pt")
    same(batches(buffer, CASES[name]), safe_load(FOLDER / f"{name}.expected.pt"))
