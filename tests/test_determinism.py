"""The same seed gives the same run on CPU: episode returns and final parameters."""

import pytest
import torch

from rlstore.algos import a2c, ppo
from rlstore.config import A2CConfig, PPOConfig
from rlstore.run import prepare


def tiny(cls, logdir, seed):
    kwargs = dict(
        seed=seed,
        logdir=logdir,
        device="cpu",
        progress=False,
        track_tensorboard=False,
        max_episode_steps=50,
    )
    if cls is PPOConfig:
        return cls(total_timesteps=4 * 4 * 64, num_steps=64, **kwargs)
    return cls(total_timesteps=4 * 5 * 60, **kwargs)


@pytest.mark.parametrize("module, cls", [(ppo, PPOConfig), (a2c, A2CConfig)])
def test_same_seed_same_run(module, cls, logdir):
    first = module.train(tiny(cls, logdir, seed=7))
    second = module.train(tiny(cls, logdir, seed=7))
    other = module.train(tiny(cls, logdir, seed=8))
    assert len(first.episode_returns) > 5
    assert first.episode_returns == second.episode_returns
    for p, q in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert first.episode_returns != other.episode_returns
    assert not all(
        torch.equal(p, q)
        for p, q in zip(first.model.parameters(), other.model.parameters(), strict=True)
    )


def test_prepare_seeds_and_flushes_denormals():
    torch.set_flush_denormal(False)
    assert (torch.tensor([1e-30]) * 1e-10).item() != 0.0  # 1e-40: a denormal float32
    prepare(PPOConfig(seed=3))
    first = torch.rand(3)
    assert (torch.tensor([1e-30]) * 1e-10).item() == 0.0
    prepare(PPOConfig(seed=3))
    assert torch.equal(torch.rand(3), first)
