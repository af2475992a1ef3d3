import pytest
import torch

torch.set_num_threads(1)  # tiny networks: threads only add noise and overhead


@pytest.fixture
def logdir(tmp_path):
    return str(tmp_path / "runs")


@pytest.fixture(params=["fast", "reference"])
def both_storage_paths(request, monkeypatch):
    """Run a test once with RolloutStorage's fast path (numpy writes and returns for storage
    in host memory) and once with its reference, the torch code a GPU runs: a module that
    uses this fixture tests both (fast=False becomes the constructor's default)."""
    from rlstore.storage import RolloutStorage

    if request.param == "reference":
        init = RolloutStorage.__init__
        names = init.__code__.co_varnames[: init.__code__.co_argcount]
        defaults = list(init.__defaults__)
        defaults[names.index("fast") - (len(names) - len(defaults))] = False
        monkeypatch.setattr(init, "__defaults__", tuple(defaults))
    return request.param
