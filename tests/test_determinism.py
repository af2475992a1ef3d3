"""The same seed gives the same run on CPU: episode returns and final parameters."""

import dataclasses

import pytest
import torch

from rlstore.algos import a2c, ppo
from rlstore.algos.a2c import A2CConfig
from rlstore.algos.ppo import PPOConfig


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


@pytest.mark.parametrize("fast_paths", ["auto", pytest.param("off", marks=pytest.mark.slow)])
@pytest.mark.parametrize("module, cls", [(ppo, PPOConfig), (a2c, A2CConfig)])
def test_same_seed_same_run(module, cls, fast_paths, logdir):
    def run(seed):
        return module.train(dataclasses.replace(tiny(cls, logdir, seed), fast_paths=fast_paths))

    first, second, other = run(7), run(7), run(8)
    assert len(first.episode_returns) > 5
    assert first.episode_returns == second.episode_returns
    for p, q in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert first.episode_returns != other.episode_returns
    assert not all(
        torch.equal(p, q)
        for p, q in zip(first.model.parameters(), other.model.parameters(), strict=True)
    )
