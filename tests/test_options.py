"""Options that change training, each tested to reach the code it names: a test here fails
when the option is ignored."""

import numpy as np
import pytest
import torch

from rlstore import algos
from rlstore.checkpoint import checkpoint_files
from rlstore.normalize import RewardScaler
from rlstore.presets import resolve


def tiny(algo, tmp_path, **overrides):
    cfg, preset = resolve(
        algo,
        "CartPole-v1",
        dict(
            logdir=str(tmp_path),
            progress=False,
            track_tensorboard=False,
            device="cpu",
            checkpoint_every=0,
            **overrides,
        ),
    )
    return cfg, algos.get(algo).train(cfg, preset)


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
@pytest.mark.parametrize("anneal_lr", [True, False])
def test_anneal_lr_sets_the_optimizers_rate(algo, anneal_lr, tmp_path):
    """The optimizer of the last iteration ran at lr * (1 - (K - 1) / K) with annealing
    (K iterations), at lr without (read from the final checkpoint's optimizer)."""
    from rlstore.algos._shared import linear_schedule

    cfg, result = tiny(
        algo, tmp_path, total_timesteps=2048, anneal_lr=anneal_lr, learning_rate=1e-3, num_steps=64
    )
    (final,) = checkpoint_files(result.run_dir / "checkpoints")[:1]
    state = torch.load(final, weights_only=False)["algorithm"]["optimizer"]
    lr = state["param_groups"][0]["lr"]
    K = cfg.num_iterations
    expected = linear_schedule(1e-3, 0.0, K, K - 1) if anneal_lr else 1e-3
    assert K > 2 and lr == pytest.approx(expected)


@pytest.mark.parametrize(
    "algo, module, name", [("ppo", "ppo", "ppo_update"), ("ppo_lstm", "ppo_lstm", "update")]
)
@pytest.mark.parametrize("anneal_clip", [True, False])
def test_anneal_clip_decays_the_clipping_coefficient(
    algo, module, name, anneal_clip, monkeypatch, tmp_path
):
    """Iteration k's update clips at clip_coef * (1 - k / K) with annealing (K iterations),
    at clip_coef without."""
    import importlib

    owner = importlib.import_module(f"rlstore.algos.{module}")
    original, seen = getattr(owner, name), []

    def watched(agent, optimizer, storage, cfg):
        seen.append(cfg.clip_coef)
        return original(agent, optimizer, storage, cfg)

    monkeypatch.setattr(owner, name, watched)
    cfg, _ = tiny(
        algo,
        tmp_path,
        total_timesteps=512,
        anneal_clip=anneal_clip,
        clip_coef=0.3,
        num_envs=2,
        num_steps=64,
        num_minibatches=2,
    )
    K = cfg.num_iterations
    expected = [0.3 * (1 - k / K) if anneal_clip else 0.3 for k in range(K)]
    assert K == 4 and seen == pytest.approx(expected)


@pytest.mark.slow
def test_per_beta_anneals_from_per_beta_to_one(monkeypatch, tmp_path):
    """Prioritized replay samples with beta going linearly from per_beta at the start to 1
    at the end of training."""
    from rlstore.storage.replay import ReplayBuffer

    betas = []
    for name in ("sample", "sample_host"):
        original = getattr(ReplayBuffer, name)

        def watched(self, batch_size, beta=0.4, _original=original):
            betas.append(beta)
            return _original(self, batch_size, beta=beta)

        monkeypatch.setattr(ReplayBuffer, name, watched)
    cfg, _ = tiny(
        "dqn",
        tmp_path,
        total_timesteps=3000,
        learning_starts=500,
        prioritized=True,
        per_beta=0.2,
        train_frequency=1,
    )
    assert len(betas) >= 2000
    assert betas[0] == pytest.approx(0.2 + 0.8 * 501 / 3000)
    assert betas == sorted(betas) and betas[-1] == pytest.approx(1.0)


def test_reward_scaling_with_several_envs_matches_a_naive_reference():
    """Each env's discounted return restarts after its own termination (and not after a
    truncation), pseudo-steps add nothing, and rewards are divided by the std of every
    return seen so far: against a per-env loop on random streams."""
    rng = np.random.default_rng(3)
    T, N, gamma = 300, 3, 0.9
    scaler = RewardScaler(N, gamma, clip=5.0)
    returns, seen, prev_done = np.zeros(N), [], np.zeros(N, dtype=bool)
    for _ in range(T):
        rewards = rng.normal(1.0, 2.0, N)
        terminated, truncated = rng.random(N) < 0.05, rng.random(N) < 0.03
        got = scaler(rewards, terminated, truncated)
        for i in range(N):
            if not prev_done[i]:
                returns[i] = returns[i] * gamma * (0.0 if terminated[i] else 1.0) + rewards[i]
                seen.append(returns[i])
        prev_done = terminated | truncated
        data, prior = np.array(seen), 1e-4  # RunningMeanStd's prior: mean 0, variance 1
        m2 = (
            ((data - data.mean()) ** 2).sum()
            + prior
            + data.mean() ** 2 * prior * len(data) / (len(data) + prior)
        )
        expected = np.clip(rewards / np.sqrt(m2 / (len(data) + prior) + 1e-8), -5.0, 5.0)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
