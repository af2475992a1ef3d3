import pytest
import torch

torch.set_num_threads(1)  # tiny networks: threads only add noise and overhead


@pytest.fixture
def logdir(tmp_path):
    return str(tmp_path / "runs")
