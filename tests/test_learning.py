"""Learning smoke tests: each algorithm, with its fast paths and without them (the
reference, --fast-paths off), gets well above a random policy on CartPole-v1 in a short
run. (A random policy's episodes last about 22 steps; the shipped suites check the
published scores: docs/results/classic.md.)"""

import pytest

from rlstore import algos

RUNS = {  # algorithm: its config overrides for a short run
    "ppo": dict(total_timesteps=30_000),
    "a2c": dict(total_timesteps=40_000),
    "dqn": dict(total_timesteps=20_000, learning_starts=1_000),
}


@pytest.mark.slow
@pytest.mark.parametrize("fast_paths", ["auto", "off"])
@pytest.mark.parametrize("algo", sorted(RUNS))
def test_learns_cartpole_with_and_without_fast_paths(algo, fast_paths, tmp_path):
    from rlstore.config import resolve

    overrides = dict(RUNS[algo], fast_paths=fast_paths, logdir=str(tmp_path), progress=False,
                     checkpoint_every=0, track_tensorboard=False, device="cpu")  # fmt: skip
    cfg, preset = resolve(algo, "CartPole-v1", overrides)
    result = algos.get(algo).train(cfg, preset)
    recent = result.episode_returns[-20:]
    assert sum(recent) / len(recent) > 100, recent
