"""TQC's pooled, sorted and truncated target and its loss against naive references;
CrossQ's batch renormalization in training and evaluation mode (and against
sb3-contrib's, with the [bench] extra), and its joint pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from extras import needs
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstore.algos.crossq import BatchRenorm, CrossQActorCritic
from rlstore.algos.tqc import critic_loss, truncated_target
from rlstore.encoders import FlatEncoder
from rlstore.storage.replay import ReplayBatch


def batch_of(rewards, discounts, terminated):
    none = torch.zeros(len(rewards))
    return ReplayBatch(
        obs=None,
        actions=None,
        rewards=torch.as_tensor(rewards, dtype=torch.float64),
        next_obs=None,
        terminated=torch.as_tensor(terminated),
        discounts=torch.as_tensor(discounts, dtype=torch.float64),
        weights=none,
        indices=none,
    )


@settings(max_examples=50, deadline=None)
@given(
    critics=st.integers(1, 5),
    n=st.integers(2, 10),
    drop=st.integers(0, 9),
    seed=st.integers(0, 2**31),
)
def test_truncated_target_is_the_naive_pool_sort_and_drop(critics, n, drop, seed):
    """Per sample: every critic's quantiles in one list, sorted, the top critics * drop
    left out, then r + gamma (1 - terminated) (q - alpha log pi)."""
    drop = min(drop, n - 1)
    rng = np.random.default_rng(seed)
    size = 4
    quantiles = rng.normal(size=(size, critics, n))
    log_prob = rng.normal(size=size)
    rewards, discounts = rng.normal(size=size), rng.choice([0.99, 0.9], size)
    terminated = rng.random(size) < 0.3
    alpha = 0.3
    got = truncated_target(
        torch.from_numpy(quantiles),
        torch.from_numpy(log_prob),
        batch_of(rewards, discounts, terminated),
        torch.tensor(alpha, dtype=torch.float64),
        drop,
    )
    for b in range(size):
        pooled = sorted(quantiles[b].ravel().tolist())
        kept = pooled[: len(pooled) - critics * drop]
        bootstrap = 0.0 if terminated[b] else discounts[b]
        want = [rewards[b] + bootstrap * (q - alpha * log_prob[b]) for q in kept]
        np.testing.assert_allclose(got[b].numpy(), want, rtol=1e-12)


def test_tqc_critic_loss_averages_over_critics_quantiles_and_targets():
    """sb3-contrib's TQC loss: the mean of rho over (batch, critic, quantile, target)."""
    rng = np.random.default_rng(0)
    quantiles, target = rng.normal(size=(3, 2, 4)), rng.normal(size=(3, 6))
    taus = (np.arange(4) + 0.5) / 4
    total = 0.0
    for b in range(3):
        for c in range(2):
            for i in range(4):
                for t in target[b]:
                    u = t - quantiles[b, c, i]
                    huber = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                    total += abs(taus[i] - (u < 0)) * huber
    want = total / (3 * 2 * 4 * 6)
    got = critic_loss(torch.from_numpy(quantiles), torch.from_numpy(target))
    assert got.item() == pytest.approx(want, rel=1e-12)
    fast = critic_loss(torch.from_numpy(quantiles), torch.from_numpy(target), fast=True)
    assert fast.item() == pytest.approx(want, rel=1e-12)


def test_tqc_fast_critic_loss_and_gradient_equal_the_reference_at_tqc_sizes():
    """The fast path (sorted targets, prefix sums) at TQC's shapes in float32, returns in
    the thousands: the loss and the critics' gradient as the reference gives them."""
    torch.manual_seed(0)
    quantiles = (1000 + 300 * torch.randn(256, 5, 25)).requires_grad_(True)
    target = 1000 + 300 * torch.randn(256, 115)
    target[:, 50:60] = quantiles.detach()[:, 0, :10]  # ties between targets and predictions
    losses, grads = [], []
    for fast in (False, True):
        loss = critic_loss(quantiles, target, fast)
        losses.append(loss.item())
        grads.append(torch.autograd.grad(loss, quantiles)[0])
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-9)


def test_batch_renorm_normalizes_by_the_batch_in_training_and_the_running_statistics_in_eval():
    torch.manual_seed(0)
    layer = BatchRenorm(3, momentum=0.1, warmup_steps=5)
    x = torch.randn(64, 3) * torch.tensor([1.0, 2.0, 5.0]) + torch.tensor([0.0, 3.0, -1.0])
    out = layer(x)  # training: batch mean and (unbiased) variance
    want = (x - x.mean(0)) / (x.var(0) + 1e-3).sqrt()
    torch.testing.assert_close(out, want)
    # running statistics moved 10% of the way from (0, 1) to the batch's
    torch.testing.assert_close(layer.running_mean, 0.1 * x.mean(0))
    torch.testing.assert_close(layer.running_var, 0.9 + 0.1 * x.var(0))
    assert layer.steps.item() == 1
    layer.eval()
    before = layer.running_mean.clone()
    out = layer(x)
    torch.testing.assert_close(
        out, (x - layer.running_mean) / (layer.running_var + 1e-3).sqrt()
    )  # and nothing updated
    torch.testing.assert_close(layer.running_mean, before)
    assert layer.steps.item() == 1


def test_batch_renorm_after_warmup_normalizes_toward_the_running_statistics():
    """Past warmup, with r and d inside their clips, a training pass gives what the
    running statistics give (r and d carry no gradient, so gradients are batch norm's)."""
    torch.manual_seed(1)
    layer = BatchRenorm(2, momentum=0.0, warmup_steps=0)  # momentum 0: statistics stay
    running = {"running_mean": torch.tensor([0.5, -0.5]), "running_var": torch.tensor([1.5, 0.8])}
    layer.load_state_dict(layer.state_dict() | running | {"steps": torch.tensor(1)})
    x = torch.randn(256, 2)
    trained = layer(x)
    layer.eval()
    torch.testing.assert_close(trained, layer(x), atol=2e-3, rtol=0)


def test_batch_renorm_restored_past_its_warmup_goes_on_as_the_layer_it_was_saved_from():
    """The warm-up is decided by a host copy of the pass count (no device read in a
    pass); a layer loaded from another's state dict reads it again, so its passes are the
    other's, bit for bit, on either side of the warm-up's end."""
    torch.manual_seed(4)
    batches = [torch.randn(32, 3) * (1 + i) + i for i in range(6)]
    saved = BatchRenorm(3, momentum=0.2, warmup_steps=2)
    for x in batches[:2]:
        saved(x)
    restored = BatchRenorm(3, momentum=0.2, warmup_steps=2)
    restored.load_state_dict(saved.state_dict())
    for x in batches[2:]:
        assert torch.equal(restored(x), saved(x))
    assert restored.steps.item() == saved.steps.item() == 6


def naive_batch_renorm(layer, x, running_mean, running_var, steps):
    """sb3-contrib's BatchRenorm1d forward in training mode as written there: x.var(0),
    (x - mean) / sqrt(var + eps), then scale and bias."""
    batch_mean, batch_var = x.mean(0), x.var(0)
    mean, var = batch_mean, batch_var
    if steps > layer.warmup_steps:
        running_std = (running_var + layer.eps).sqrt()
        r = ((batch_var + layer.eps).sqrt() / running_std).detach().clamp(1 / 3, 3)
        d = ((batch_mean - running_mean) / running_std).detach().clamp(-5, 5)
        mean, var = batch_mean - d * batch_var.sqrt() / r, batch_var / r**2
    return layer.scale * ((x - mean) / (var + layer.eps).sqrt()) + layer.bias


def test_batch_renorm_outputs_and_gradients_equal_the_naive_formula():
    """The layer's folded x * a + b against the formula term by term, on random batches
    with a learnt scale and bias: outputs and the gradients of x, scale and bias, through
    warmup and after it, with r and d inside their clips and pinned at them."""
    torch.manual_seed(5)
    layer = BatchRenorm(6, momentum=0.3, warmup_steps=2)
    with torch.no_grad():
        layer.scale.copy_(torch.randn(6))
        layer.bias.copy_(torch.randn(6))
    for step in range(8):
        spread = 40.0 if step == 6 else 1.0 + step / 4  # step 6: r and d at their clips
        x = (torch.randn(48, 6) * spread + step).requires_grad_()
        weights = torch.randn(48, 6)  # a loss whose gradient is not the same everywhere
        state = layer.running_mean.clone(), layer.running_var.clone(), layer.steps.item()
        layer.train()
        got = layer(x)
        got_grads = torch.autograd.grad((got * weights).sum(), (x, layer.scale, layer.bias))
        want = naive_batch_renorm(layer, x, *state)
        want_grads = torch.autograd.grad((want * weights).sum(), (x, layer.scale, layer.bias))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
        layer.eval()
        running = layer.running_mean, layer.running_var
        want = layer.scale * (x - running[0]) / (running[1] + layer.eps).sqrt() + layer.bias
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)


@needs("bench", "sb3_contrib")
def test_batch_renorm_equals_sb3_contribs():
    """With the [bench] extra: sb3-contrib's BatchRenorm, same inputs, train and eval
    mode, through warmup and after."""
    from sb3_contrib.common import torch_layers as layers

    torch.manual_seed(2)
    ours = BatchRenorm(4, momentum=0.01, warmup_steps=3)
    theirs = layers.BatchRenorm1d(4, momentum=0.01, warmup_steps=3)
    for step in range(8):
        x = torch.randn(32, 4) * (step + 1) + step
        for mode in (True, False):
            ours.train(mode)
            theirs.train(mode)
            torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(ours.running_var, theirs.ra_var)


def test_crossq_acts_with_the_running_statistics_and_its_modes_stay_eval():
    """Acting (and a saved policy) uses the running statistics: a batch of one acts as
    the same observation in a batch of many; the networks are built in eval mode."""
    torch.manual_seed(3)
    agent = CrossQActorCritic([-1.0], [1.0], (16, 16), (32, 32), FlatEncoder((3,)))
    assert not any(m.training for m in agent.modules())
    obs = torch.randn(10, 3)
    torch.testing.assert_close(
        agent.deterministic_action(obs[:1]), agent.deterministic_action(obs)[:1]
    )


def test_crossq_step_runs_the_critics_once_in_training_mode_on_both_halves():
    """One gradient step at the actor's turn: the critics' one training-mode pass holds
    the batch's (s, a) and (s', a') together (2 x batch rows); the actor's one is on s;
    every other pass (a' from s', the actor's Q) uses the running statistics."""
    import gymnasium as gym

    from rlstore.algos.crossq import CrossQConfig, gradient_step
    from rlstore.algos.sac import EntropyCoefficient
    from rlstore.storage.replay import ReplayBuffer

    torch.manual_seed(4)
    rng = np.random.default_rng(4)
    envs = gym.make_vec("Pendulum-v1", 1)
    buffer = ReplayBuffer(100, 1, (3,), np.float32, action_shape=(1,), action_dtype=torch.float32)
    obs, _ = envs.reset(seed=0)
    for _ in range(40):
        action = rng.uniform(-2, 2, (1, 1)).astype(np.float32)
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        buffer.add(obs, action, reward, next_obs, terminated, truncated)
        obs = next_obs
    agent = CrossQActorCritic([-2.0], [2.0], (16, 16), (32, 32), FlatEncoder((3,)))
    passes = []
    for name, module in agent.named_modules():
        if isinstance(module, BatchRenorm) and name.endswith(".0"):  # each net's first
            module.register_forward_hook(
                lambda m, args, out, name=name: passes.append((name, m.training, len(args[0])))
            )
    entropy = EntropyCoefficient()
    optimizers = {
        "actor": torch.optim.Adam(agent.actor.parameters()),
        "critic": torch.optim.Adam(agent.critic.parameters()),
        "alpha": torch.optim.Adam([entropy.log_alpha]),
    }
    cfg = CrossQConfig(batch_size=16, policy_frequency=3)
    gradient_step(3, agent, entropy, optimizers, buffer, cfg, -1.0)
    assert passes == [
        ("actor.0", False, 16),  # a' ~ pi(s'), running statistics
        ("critic.0.0", True, 32),  # the joint pass
        ("critic.1.0", True, 32),
        ("actor.0", True, 16),  # the actor's update pass
        ("critic.0.0", False, 16),  # Q(s, pi(s)) for the actor's loss
        ("critic.1.0", False, 16),
    ]
    assert not any(m.training for m in agent.modules())


@pytest.mark.parametrize("algo, critics", [("tqc", 3), ("crossq", 2)])
def test_a_saved_policy_acts_in_the_box_and_gives_each_critics_q(algo, critics, tmp_path):
    from tiny_runs import SETUPS, replace

    import rlstore

    module, cfg = SETUPS[algo]
    result = module.train(replace(cfg, logdir=str(tmp_path), checkpoint_every=0))
    policy = rlstore.load_policy(result.run_dir)
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    actions = policy(obs)
    assert actions.dtype == np.float32 and actions.shape == (64, 1)
    assert (np.abs(actions) <= 2).all()
    np.testing.assert_array_equal(actions, policy(obs))  # deterministic: the mode
    assert policy.q_values(obs).shape == (64, critics)
    # CrossQ's saved statistics: the policy acts on one observation as on the batch
    np.testing.assert_allclose(policy(obs[0]), actions[0], rtol=1e-6)
