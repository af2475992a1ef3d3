"""The distributional and noisy pieces (rlstore/algos/_distributional.py) against naive
references: C51's projection per atom, the quantile Huber loss by its formula, factorized
noise's statistics, and evaluation without noise."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from extras import needs
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_twins import twin_buffers

from rlstore.algos._distributional import (
    DistributionalQNetwork,
    NoisyLinear,
    categorical_projection,
    quantile_huber_loss,
    quantile_midpoints,
    sorted_quantile_huber_loss,
)
from rlstore.encoders import FlatEncoder


def naive_projection(probs, reward, discount, support):
    """One row, atom by atom: Tz_j = clip(r + discount z_j), b = (Tz_j - v_min) / dz; its
    mass goes to floor(b) and ceil(b) in proportion to closeness, all of it when b is an
    atom."""
    n, v_min, v_max = len(support), support[0], support[-1]
    dz = (v_max - v_min) / (n - 1)
    out = [0.0] * n
    for j in range(n):
        tz = min(max(reward + discount * support[j], v_min), v_max)
        b = (tz - v_min) / dz
        low, high = int(np.floor(b)), int(np.ceil(b))
        if low == high:
            out[low] += probs[j]
        else:
            out[low] += probs[j] * (high - b)
            out[high] += probs[j] * (b - low)
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 21),
    batch=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    v=st.sampled_from([(-10.0, 10.0), (0.0, 1.0), (-100.0, 100.0), (-3.0, 7.0)]),
)
def test_categorical_projection_is_the_per_atom_loop(n, batch, seed, v):
    """On random inputs whose shifted atoms land inside, outside and on the bounds and on
    atoms: terminations (discount 0), n-step discounts, rewards that push past v_max."""
    rng = np.random.default_rng(seed)
    support = torch.linspace(v[0], v[1], n, dtype=torch.float64)
    probs = torch.from_numpy(rng.dirichlet(np.ones(n), size=batch))
    dz = (v[1] - v[0]) / (n - 1)
    rewards = torch.from_numpy(
        np.where(rng.random(batch) < 0.3, rng.integers(-3, 4, batch) * dz, rng.normal(0, 5, batch))
    )
    discounts = torch.from_numpy(rng.choice([0.0, 1.0, 0.99, 0.99**3, 0.5], size=batch))
    got = categorical_projection(probs, rewards, discounts, support)
    for i in range(batch):
        want = naive_projection(
            probs[i].tolist(), rewards[i].item(), discounts[i].item(), support.tolist()
        )
        np.testing.assert_allclose(got[i].numpy(), want, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, atol=1e-12)


def test_categorical_projection_by_hand():
    """Atoms -1, 0, 1. A termination (discount 0) at r = 0.25 puts all mass at 0.25:
    3/4 on atom 0 and 1/4 on atom 1. Discount 1 and r = 1 shifts every atom up by one: the
    top two clip to 1, the bottom one lands on 0."""
    support = torch.tensor([-1.0, 0.0, 1.0])
    probs = torch.tensor([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    got = categorical_projection(
        probs, torch.tensor([0.25, 1.0]), torch.tensor([0.0, 1.0]), support
    )
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.75, 0.25], [0.0, 0.2, 0.8]]))


def naive_quantile_huber(pred, target, taus, kappa):
    total = 0.0
    for i, theta in enumerate(pred):
        row = 0.0
        for t in target:
            u = t - theta
            huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
            row += abs(taus[i] - (1.0 if u < 0 else 0.0)) * huber / kappa
        total += row / len(target)
    return total


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    kappa=st.sampled_from([1.0, 0.5, 2.0]),
    seed=st.integers(0, 2**31),
)
def test_quantile_huber_loss_is_its_formula(n, m, kappa, seed):
    rng = np.random.default_rng(seed)
    pred, target = rng.normal(0, 2, (3, n)), rng.normal(0, 2, (3, m))
    taus = quantile_midpoints(n).double()
    got = quantile_huber_loss(torch.from_numpy(pred), torch.from_numpy(target), taus, kappa)
    want = [naive_quantile_huber(pred[b], target[b], taus.tolist(), kappa) for b in range(3)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 12),
    m=st.integers(1, 12),
    kappa=st.sampled_from([1.0, 0.5, 2.0]),
    ties=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_the_sorted_quantile_huber_loss_is_the_reference_with_its_gradient(n, m, kappa, ties, seed):
    """The fast path against the reference (itself checked against the formula above), in
    float64, on unsorted targets; with `ties`, targets at predictions and at predictions
    +- kappa, the runs' boundaries."""
    rng = np.random.default_rng(seed)
    pred, target = rng.normal(0, 2, (3, n)), rng.normal(0, 2, (3, m))
    if ties:
        picks = rng.integers(0, n, (3, m))
        offsets = rng.choice([-kappa, 0.0, kappa], (3, m))
        target = np.take_along_axis(pred, picks, 1) + offsets
    taus = quantile_midpoints(n).double()
    results = []
    for loss in (quantile_huber_loss, sorted_quantile_huber_loss):
        predicted = torch.tensor(pred, requires_grad=True)
        value = loss(predicted, torch.from_numpy(target), taus, kappa)
        weights = torch.arange(1.0, 4.0, dtype=torch.float64)  # a per-sample upstream grad
        results.append((value.detach().numpy(), torch.autograd.grad(value @ weights, predicted)[0]))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(results[1][1].numpy(), results[0][1].numpy(), atol=1e-10)


def test_quantile_regression_finds_the_quantiles():
    """Minimizing the loss against samples of a distribution moves each output to its
    quantile: the 10 quantiles of U(0, 1) at (2i + 1) / 20."""
    torch.manual_seed(0)
    theta = torch.zeros(1, 10, requires_grad=True)
    optimizer = torch.optim.Adam([theta], lr=0.01)
    taus = quantile_midpoints(10)
    for _ in range(3000):
        loss = quantile_huber_loss(theta, torch.rand(1, 256), taus, kappa=0.01).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    np.testing.assert_allclose(theta.detach().numpy()[0], taus.numpy(), atol=0.03)


def test_quantile_midpoints():
    torch.testing.assert_close(quantile_midpoints(4), torch.tensor([0.125, 0.375, 0.625, 0.875]))


def test_noisy_linear_noise_is_factorized_with_unit_gaussian_draws():
    """weight_epsilon = f(e_out) f(e_in)^T with f(x) = sign(x) sqrt|x|, e ~ N(0, 1): rank
    one, its bias noise is f(e_out), and f(e)^2 = |e| has mean sqrt(2 / pi)."""
    torch.manual_seed(0)
    layer = NoisyLinear(300, 200)
    squares = []
    for _ in range(50):
        layer.reset_noise()
        eps = layer.weight_epsilon
        assert torch.linalg.matrix_rank(eps).item() == 1
        e_out = layer.bias_epsilon
        e_in = eps[0] / e_out[0]
        torch.testing.assert_close(eps, torch.outer(e_out, e_in))
        squares.append(torch.cat([e_out.square(), e_in.square()]))
    mean = torch.cat(squares).mean().item()
    assert abs(mean - np.sqrt(2 / np.pi)) < 0.01  # |N(0,1)|'s mean; 25k draws
    assert layer.weight_sigma.flatten()[0].item() == pytest.approx(0.5 / np.sqrt(300))


def test_noisy_linear_uses_noise_in_training_and_its_means_in_evaluation():
    torch.manual_seed(1)
    layer = NoisyLinear(5, 3)
    x = torch.randn(4, 5)
    mean_out = x @ layer.weight_mu.T + layer.bias_mu
    assert not torch.allclose(layer(x), mean_out)
    layer.eval()
    torch.testing.assert_close(layer(x), mean_out)
    layer.reset_noise()
    torch.testing.assert_close(layer(x), mean_out)  # noise drawn, still none used


def test_a_noisy_network_acts_without_noise_when_evaluated():
    """A saved policy (eval mode) gives the same Q-values whatever noise its layers hold."""
    torch.manual_seed(2)
    net = DistributionalQNetwork(
        3, "categorical", 11, (16, 16), FlatEncoder((4,)), dueling=True, noisy=True
    )
    obs = torch.randn(8, 4)
    net.eval()
    before = net.q_values(obs)
    net.reset_noise()
    torch.testing.assert_close(net.q_values(obs), before)
    net.train()
    assert not torch.allclose(net.q_values(obs), before)


def test_distributional_q_values_are_the_expectations():
    torch.manual_seed(3)
    obs = torch.randn(5, 4)
    categorical = DistributionalQNetwork(2, "categorical", 7, (8,), FlatEncoder((4,)))
    out = categorical(obs)
    want = (out.softmax(-1) * torch.linspace(-10, 10, 7)).sum(-1)
    torch.testing.assert_close(categorical.q_values(obs), want)
    quantile = DistributionalQNetwork(2, "quantile", 7, (8,), FlatEncoder((4,)), dueling=True)
    torch.testing.assert_close(quantile.q_values(obs), quantile(obs).mean(-1))
    rebuilt = DistributionalQNetwork.from_spec({"obs_shape": [4], **quantile.spec_args()})
    rebuilt.load_state_dict(quantile.state_dict())
    torch.testing.assert_close(rebuilt.q_values(obs), quantile.q_values(obs))


class _Batches:
    """A buffer that hands out given batches in turn."""

    def __init__(self, batches):
        self.batches = iter(batches)

    def sample(self, batch_size, *args, **kwargs):
        return next(self.batches)


@needs("bench", "sb3_contrib")
def test_qrdqn_gradient_steps_equal_sb3_contribs():
    """An independent reference: from the same weights and batches, six of our QR-DQN
    gradient steps (DQN's gradient_step with QR-DQN's loss) leave the network where six of
    sb3-contrib's QRDQN.train steps leave it, with the same losses. (sb3-contrib lays out
    its outputs quantile-major, (batch, quantiles, actions); ours action-major: the output
    layer's rows are permuted to match.)"""
    import gymnasium as gym
    from sb3_contrib import QRDQN
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    from rlstore.algos import dqn
    from rlstore.algos.qrdqn import QRDQNConfig, build_network, quantile_loss
    from rlstore.storage.replay import ReplayBatch

    obs_dim, actions, quantiles, size = 4, 3, 5, 32
    cfg = QRDQNConfig(q_hidden=(16, 16), n_quantiles=quantiles, batch_size=size, gamma=0.97)
    space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    env = gym.make("CartPole-v1")  # (only its spaces are read; replaced below)
    env.observation_space, env.action_space = space, gym.spaces.Discrete(actions)
    torch.manual_seed(0)
    model = QRDQN(
        "MlpPolicy",
        env,
        learning_rate=cfg.learning_rate,
        batch_size=size,
        gamma=cfg.gamma,
        learning_starts=0,
        policy_kwargs=dict(net_arch=[16, 16], n_quantiles=quantiles),
        device="cpu",
    )
    model.set_logger(Logger(None, []))
    ours = build_network(cfg, space, actions)
    for p in ours.parameters():
        p.data.normal_(0.0, 0.3)
    target = copy.deepcopy(ours)
    for p in target.parameters():
        p.data += 0.1 * torch.randn_like(p)
    # our output row a * n + q is sb3-contrib's q * A + a
    order = torch.arange(actions * quantiles).view(actions, quantiles).T.reshape(-1)

    def copy_into(net, sb3_net):
        params = list(sb3_net.quantile_net.parameters())
        for i, (mine, theirs) in enumerate(zip(net.parameters(), params, strict=True)):
            value = mine.data
            if i >= len(params) - 2:  # the output layer: quantile-major rows
                value = value[order]
            theirs.data.copy_(value)

    copy_into(ours, model.quantile_net)
    copy_into(target, model.quantile_net_target)
    rng = np.random.default_rng(1)
    batches, samples = [], []
    for _ in range(6):
        obs = torch.from_numpy(rng.normal(size=(size, obs_dim)).astype(np.float32))
        next_obs = torch.from_numpy(rng.normal(size=(size, obs_dim)).astype(np.float32))
        action = torch.from_numpy(rng.integers(0, actions, size))
        reward = torch.from_numpy(rng.normal(size=size).astype(np.float32))
        terminated = torch.from_numpy(rng.random(size) < 0.2)
        ones = torch.ones(size)
        batches.append(
            ReplayBatch(obs, action, reward, next_obs, terminated, ones * cfg.gamma, ones, ones)
        )
        samples.append(
            ReplayBufferSamples(
                obs, action[:, None], next_obs, terminated.float()[:, None], reward[:, None], None
            )
        )
    optimizer = torch.optim.Adam(ours.parameters(), lr=cfg.learning_rate, eps=cfg.optimizer_eps())
    buffer, model.replay_buffer = _Batches(batches), _Batches(samples)
    for _ in range(6):
        loss, _ = dqn.gradient_step(ours, target, optimizer, buffer, 0.4, cfg, None, quantile_loss)
        model.train(gradient_steps=1, batch_size=size)
        assert loss.item() == pytest.approx(model.logger.name_to_value["train/loss"], rel=1e-5)
    mine = list(ours.parameters())
    theirs = list(model.quantile_net.quantile_net.parameters())
    for i, (x, y) in enumerate(zip(mine, theirs, strict=True)):
        if i >= len(theirs) - 2:
            x = x[order]
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("prioritized", [False, True])
def test_qrdqn_with_many_quantiles_takes_the_sorted_loss_and_the_same_gradient(
    prioritized, monkeypatch
):
    """From SORTED_LOSS_FROM quantiles on, QR-DQN's loss runs by sorted targets (a fast
    path): its loss, per-sample priorities and gradient are the reference's, up to
    rounding, and --fast-paths off takes the reference."""
    import gymnasium as gym

    from rlstore.algos import qrdqn
    from rlstore.storage.replay import ReplayBatch

    sorted_calls = []
    monkeypatch.setattr(
        qrdqn,
        "sorted_quantile_huber_loss",
        lambda *args: sorted_calls.append(1) or sorted_quantile_huber_loss(*args),
    )
    size, obs_dim, actions = 32, 4, 3
    space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    rng = np.random.default_rng(0)
    obs, next_obs = (
        torch.from_numpy(rng.normal(size=(size, obs_dim)).astype(np.float32)) for _ in range(2)
    )
    batch = ReplayBatch(
        obs,
        torch.from_numpy(rng.integers(0, actions, size)),
        torch.from_numpy(rng.normal(size=size).astype(np.float32)),
        next_obs,
        torch.from_numpy(rng.random(size) < 0.2),
        torch.full((size,), 0.99),
        torch.from_numpy(rng.random(size).astype(np.float32)),  # importance weights
        torch.ones(size),
    )
    results = []
    for fast_paths in ("off", "auto"):
        cfg = qrdqn.QRDQNConfig(
            n_quantiles=qrdqn.SORTED_LOSS_FROM,
            q_hidden=(16,),
            prioritized=prioritized,
            fast_paths=fast_paths,
        )
        torch.manual_seed(0)
        network = qrdqn.build_network(cfg, space, actions)
        target = copy.deepcopy(network)
        loss, per_sample, _ = qrdqn.quantile_loss(network, target, batch, cfg)
        grads = torch.autograd.grad(loss, list(network.parameters()))
        results.append((loss, per_sample, grads))
    assert len(sorted_calls) == 1  # fast_paths "auto" only
    (loss, per_sample, grads), (fast_loss, fast_per_sample, fast_grads) = results
    torch.testing.assert_close(fast_loss, loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(fast_per_sample, per_sample, rtol=1e-6, atol=1e-7)
    for fast, plain in zip(fast_grads, grads, strict=True):
        torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "prioritized, double_dqn, max_grad_norm, masked",
    [(False, False, None, False), (True, True, 0.5, False), (False, True, None, True)],
)
def test_qrdqn_host_gradient_steps_equal_the_torch_steps(
    prioritized, double_dqn, max_grad_norm, masked
):
    """gradient_step with HostDQNStep and QR-DQN's numpy loss (host_quantile_loss) and
    with the torch loss: five steps from the same weights on the same replay, the same
    losses, Q(s, a), parameters and (with PER) priorities, up to rounding. Rewards of
    several units put the pairs on both sides of the Huber loss's kink; terminations and
    truncations are in the replay, and with `masked` action masks (next states that allow
    no action bootstrap from nothing)."""
    import gymnasium as gym

    from rlstore.algos import dqn, qrdqn
    from rlstore.host_updates import HostDQNStep

    obs_dim, actions = 4, 3
    cfg = qrdqn.QRDQNConfig(
        n_quantiles=7,
        q_hidden=(16, 16),
        batch_size=32,
        prioritized=prioritized,
        double_dqn=double_dqn,
        max_grad_norm=max_grad_norm,
        learning_rate=1e-2,
    )
    assert qrdqn.host_loss(cfg) is qrdqn.host_quantile_loss
    space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
    torch.manual_seed(3)
    q, target = (qrdqn.build_network(cfg, space, actions) for _ in range(2))
    twin, twin_target = copy.deepcopy(q), copy.deepcopy(target)
    opt, twin_opt = (
        torch.optim.Adam(n.parameters(), lr=cfg.learning_rate, eps=cfg.optimizer_eps(), fused=True)
        for n in (q, twin)
    )
    assert HostDQNStep.supports(q, opt)
    buffers = twin_buffers(obs_dim, actions, prioritized, seed=4, reward_scale=3.0, masked=masked)
    host_step = HostDQNStep(q, target, opt, qrdqn.host_quantile_loss)
    for _ in range(5):
        loss, q_value = dqn.gradient_step(q, target, opt, buffers[0], 0.4, cfg, host_step)
        twin_loss, twin_q = dqn.gradient_step(
            twin, twin_target, twin_opt, buffers[1], 0.4, cfg, None, qrdqn.quantile_loss
        )
        torch.testing.assert_close(loss, twin_loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q_value, twin_q, rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(q.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)
    if prioritized:
        np.testing.assert_allclose(
            buffers[0].priorities.tree.leaves, buffers[1].priorities.tree.leaves, rtol=1e-4
        )


def test_qrdqn_takes_the_host_step_below_the_sorted_loss_only(monkeypatch, tmp_path):
    """A QR-DQN run takes its gradient steps in numpy with few quantiles on an MLP, and in
    torch from SORTED_LOSS_FROM quantiles, with a dueling head, or with --fast-paths off."""
    from rlstore.algos import qrdqn

    calls, host_quantile_loss = [], qrdqn.host_quantile_loss
    monkeypatch.setattr(
        qrdqn, "host_quantile_loss", lambda *args: calls.append(1) or host_quantile_loss(*args)
    )
    common = dict(
        env_id="CartPole-v1",
        total_timesteps=300,
        learning_starts=100,
        logdir=str(tmp_path),
        capture_video=False,
        q_hidden=(8,),
    )
    runs = [
        (dict(n_quantiles=5), True),
        (dict(n_quantiles=qrdqn.SORTED_LOSS_FROM), False),
        (dict(n_quantiles=5, dueling=True), False),
        (dict(n_quantiles=5, fast_paths="off"), False),
    ]
    for i, (options, host) in enumerate(runs):
        calls.clear()
        qrdqn.train(qrdqn.QRDQNConfig(seed=i, **common, **options))
        assert bool(calls) == host, options
