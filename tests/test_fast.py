"""The fast paths (rlstore/host_networks.py, host_updates.py, lean.py; the run's settings in
run.py), each against the reference it stands for: the same bits, or the same values to
float32 rounding where numpy computes what torch does."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from extras import requires_extra
from replay_twins import twin_buffers
from test_masks import random_masks
from tiny_runs import Watch
from torch import nn
from torch.distributions import Categorical, Normal

from rlstore.host_networks import GreedyActor, SequentialRunner
from rlstore.lean import LeanDQNStep, LeanRollout, lean_env_of
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.networks import (
    ActorCritic,
    CnnQNetwork,
    QNetwork,
    mlp,
    sample_categorical,
    sample_gaussian,
)


def test_sequential_runner_is_the_sequential_bit_for_bit():
    torch.manual_seed(0)
    q = QNetwork(5, 3)
    for net in (mlp(5, (64, 64), 3, out_std=1.0), nn.Sequential(*q.body, q.advantage)):
        runner = SequentialRunner(net)
        x = torch.randn(33, 5)
        assert torch.equal(runner(x), net(x))
        torch.nn.init.normal_(net[0].weight)  # in-place changes are seen
        assert torch.equal(runner(x), net(x))
    net.to("meta").to_empty(device="cpu")  # new parameter objects are taken up
    for p in net.parameters():  # (to_empty leaves them uninitialized)
        torch.nn.init.normal_(p, std=0.1)
    assert torch.equal(runner(x), net(x))
    with pytest.raises(ValueError, match="alternate"):
        SequentialRunner([nn.Linear(2, 2), nn.Linear(2, 2)])


def test_sample_categorical_follows_the_distribution_and_its_log_prob():
    torch.manual_seed(1)
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]]).repeat(40_000, 1)
    action, log_prob = sample_categorical(logits)
    dist = Categorical(logits=logits)
    torch.testing.assert_close(log_prob, dist.log_prob(action))
    freq = torch.bincount(action, minlength=4).float() / len(action)
    torch.testing.assert_close(freq, dist.probs[0], atol=0.01, rtol=0)


def test_sample_gaussian_log_prob_is_the_normals():
    torch.manual_seed(2)
    mean, log_std = torch.randn(1000, 3), torch.randn(1, 3) * 0.3
    action, log_prob = sample_gaussian(mean, log_std)
    expected = Normal(mean, log_std.exp()).log_prob(action).sum(-1)
    torch.testing.assert_close(log_prob, expected)
    z = (action - mean) / log_std.exp()
    assert abs(float(z.mean())) < 0.05 and abs(float(z.std()) - 1) < 0.05


@pytest.mark.parametrize("continuous", [False, True])
def test_host_actor_critic_acts_as_the_torch_policy(continuous):
    """act_on_host: the torch policy's values and log-probs (to float32 rounding) for the
    actions it samples, samples that follow the policy, the live parameters after an
    optimizer step, and the same actions again from the same numpy seed."""
    torch.manual_seed(3)
    agent = ActorCritic(6, 3, continuous=continuous)
    optimizer = torch.optim.Adam(agent.parameters(), lr=0.05)
    obs = np.random.default_rng(0).normal(size=(4000, 6)).astype(np.float32)
    for _ in range(2):  # before and after an optimizer step
        np.random.seed(5)
        action, log_prob, value = agent.act_on_host(obs)
        assert action.dtype == (np.float32 if continuous else np.int64)
        assert log_prob.dtype == value.dtype == np.float32
        with torch.no_grad():
            expected_lp, _, expected_v = agent.evaluate(
                torch.from_numpy(obs), torch.from_numpy(action)
            )
        torch.testing.assert_close(torch.from_numpy(log_prob), expected_lp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.from_numpy(value), expected_v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            torch.from_numpy(agent.act_on_host.value(obs)), expected_v, rtol=1e-5, atol=1e-5
        )
        np.random.seed(5)
        again = agent.act_on_host(obs)[0]
        np.testing.assert_array_equal(again, action)
        if not continuous:  # frequencies follow the mean probabilities over the batch
            with torch.no_grad():
                probs = agent.actor_path(torch.from_numpy(obs)).softmax(-1).mean(0).numpy()
            freq = np.bincount(action, minlength=3) / len(action)
            np.testing.assert_allclose(freq, probs, atol=0.02)
        agent.evaluate(torch.from_numpy(obs[:64]), torch.from_numpy(action[:64]))[
            0
        ].sum().backward()
        optimizer.step()
    agent.to("meta")  # parameters not in host memory: the caller falls back to torch
    assert agent.act_on_host(obs) is None and agent.act_on_host.value(obs) is None


def test_host_actor_critic_samples_by_the_inverse_cdf():
    """A categorical sample is the number of cumulative probabilities below the uniform,
    at most the last action (a uniform above a total rounded below 1), and its log-prob
    that of the log-softmax; here the actor's single layer passes the logits through."""
    rng = np.random.default_rng(1)
    agent = ActorCritic(7, 7)
    identity = [(np.eye(7, dtype=np.float32), np.zeros(7, np.float32))]
    critic = [(np.ones((7, 1), np.float32), np.zeros(1, np.float32))]
    above_total = 0
    for _ in range(300):
        logits = (rng.normal(size=(64, 7)) * rng.choice([0.1, 3.0, 30.0])).astype(np.float32)
        u = rng.random((64, 1)).astype(np.float32)
        u[:32] = np.float32(1) - np.float32(2**-24)  # the largest float32 below 1
        action, log_prob, value = agent.act_on_host.sample(logits, identity, critic, u)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        cdf = np.exp(log_probs).cumsum(-1)
        expected = np.minimum((cdf < u).sum(-1), 6)
        above_total += int((cdf[:, -1] < u[:, 0]).sum())
        np.testing.assert_array_equal(action, expected)
        np.testing.assert_array_equal(log_prob, log_probs[np.arange(64), expected])
        np.testing.assert_array_equal(value, (logits @ critic[0][0])[:, 0])
    assert above_total > 0


class InfoEnv(gym.Env):
    """Counts steps, reports them in `info` on odd steps, terminates every 4th step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {"reset": True}

    def step(self, action):
        self.t += 1
        info = {"t": self.t} if self.t % 2 else {}
        obs = np.array([self.t, action], np.float32)
        return obs, float(action), self.t % 4 == 0, False, info


@pytest.mark.parametrize(
    "make_one",
    [
        lambda: gym.make("CartPole-v1", max_episode_steps=9),
        lambda: gym.make("Pendulum-v1", max_episode_steps=7),  # Box actions
        lambda: gym.make("Acrobot-v1", max_episode_steps=11),
        InfoEnv,  # infos from steps and resets
    ],
)
@pytest.mark.parametrize("num_envs", [1, 3])
def test_lean_sync_vector_env_steps_as_gymnasiums(make_one, num_envs):
    """The same outputs as Gymnasium's SyncVectorEnv, step by step, across resets."""
    ours = LeanSyncVectorEnv([make_one] * num_envs)
    theirs = gym.vector.SyncVectorEnv([make_one] * num_envs)
    for a, b in zip(ours.reset(seed=2), theirs.reset(seed=2), strict=True):
        np.testing.assert_equal(a, b)
    theirs.action_space.seed(2)
    for _ in range(60):
        action = theirs.action_space.sample()
        for a, b in zip(ours.step(action), theirs.step(action), strict=True):
            np.testing.assert_equal(a, b)
    quiet = LeanSyncVectorEnv([make_one] * num_envs, infos=False)  # the same, without infos
    for a, b in zip(quiet.reset(seed=2), LeanSyncVectorEnv([make_one] * num_envs).reset(seed=2)):
        np.testing.assert_equal(a, b)
    theirs.reset(seed=2)
    theirs.action_space.seed(2)
    for _ in range(30):
        action = theirs.action_space.sample()
        expected = theirs.step(action)
        got = quiet.step(action)
        for a, b in zip(got[:4], expected[:4], strict=True):
            np.testing.assert_equal(a, b)
        assert got[4] == {}
    with pytest.raises(ValueError):  # one action per env, as Gymnasium's step insists
        ours.step(action[:-1] if num_envs > 1 else np.concatenate([action, action]))
    ours.close()
    theirs.close()


def torch_greedy(
    q_network: nn.Module, obs: np.ndarray, masks: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The oracle: argmax of the module's Q-values (among the actions `masks` allows), and
    which rows have no near-tie."""
    with torch.no_grad():
        obs = torch.from_numpy(obs)
        q = (q_network.q_values(obs) if hasattr(q_network, "q_values") else q_network(obs)).numpy()
    if masks is not None:
        q = np.where(masks, q, -np.inf)
    top2 = np.sort(q, axis=-1)[:, -2:]
    return q.argmax(-1), top2[:, 1] - top2[:, 0] > 1e-4


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("use_numpy", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_greedy_actor_picks_the_q_networks_argmax(dueling, use_numpy, masked):
    torch.manual_seed(0)
    q_network = QNetwork(6, 5, dueling=dueling)
    actor = GreedyActor(q_network.advantage_path, use_numpy=use_numpy)
    rng = np.random.default_rng(0)
    for rows in (1, 4, 256):
        obs = rng.normal(size=(rows, 6)).astype(np.float32) * 3
        masks = random_masks(rng, rows, 5) if masked else None
        expected, clear = torch_greedy(q_network, obs, masks)
        actions = actor(obs, masks)
        assert actions.dtype == np.int64 and actions.shape == (rows,)
        np.testing.assert_array_equal(actions[clear], expected[clear])
        assert clear.mean() > 0.9
        if masked:
            assert masks[np.arange(rows), actions].all()


def test_greedy_actor_follows_parameter_updates_and_moves():
    """Views of the live parameters: an optimizer step, a state load and a dtype move
    (which replaces the parameters) are all seen by the next call."""
    torch.manual_seed(1)
    q_network, other = QNetwork(4, 3), QNetwork(4, 3)
    actor = GreedyActor(q_network.advantage_path)
    obs = np.random.default_rng(1).normal(size=(512, 4)).astype(np.float32)
    actor(obs)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=0.5)
    q_network(torch.from_numpy(obs)).square().mean().backward()
    for change in (optimizer.step, lambda: q_network.load_state_dict(other.state_dict())):
        change()
        expected, clear = torch_greedy(q_network, obs)
        np.testing.assert_array_equal(actor(obs)[clear], expected[clear])
    q_network.double()
    with torch.no_grad():
        q_network.advantage.bias.copy_(torch.tensor([0.0, 100.0, 0.0]))
    np.testing.assert_array_equal(actor(obs), np.ones(512, dtype=np.int64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_greedy_actor_on_cuda_picks_the_cpu_networks_argmax():
    torch.manual_seed(2)
    q_network = QNetwork(4, 3)
    obs = np.random.default_rng(2).normal(size=(64, 4)).astype(np.float32)
    expected, clear = torch_greedy(q_network, obs)
    actions = GreedyActor(q_network.to("cuda").advantage_path)(obs)  # the torch path, on the GPU
    np.testing.assert_array_equal(actions[clear], expected[clear])


def test_lean_sync_vector_env_partial_reset_as_gymnasiums():
    """reset(options={"reset_mask": m}) resets those envs only, and their next step is a
    real one even after a done, as in Gymnasium's SyncVectorEnv."""
    make_one = lambda: gym.make("CartPole-v1", max_episode_steps=6)  # noqa: E731
    ours = LeanSyncVectorEnv([make_one] * 3)
    theirs = gym.vector.SyncVectorEnv([make_one] * 3)
    for envs in (ours, theirs):
        envs.reset(seed=5)
    rng = np.random.default_rng(5)
    for step in range(40):
        if step % 7 == 3:
            mask = rng.random(3) < 0.5
            mask[rng.integers(3)] = True
            ours_reset = ours.reset(options={"reset_mask": mask.copy()})
            theirs_reset = theirs.reset(options={"reset_mask": mask.copy()})
            for a, b in zip(ours_reset, theirs_reset, strict=True):
                np.testing.assert_equal(a, b)
        action = rng.integers(0, 2, 3)
        for a, b in zip(ours.step(action), theirs.step(action), strict=True):
            np.testing.assert_equal(a, b)


def reference_ppo_step(agent, optimizer, batch, cfg) -> dict:
    """One PPO minibatch step in torch, as algos/ppo.py's update takes it (under the
    batch's action masks, where it has them): the reference of the numpy step."""
    from rlstore.algos.ppo import ppo_loss

    log_prob, entropy, value = agent.evaluate(batch.obs, batch.actions, batch.action_masks)
    losses = ppo_loss(log_prob, value, entropy, batch, cfg)
    optimizer.zero_grad()
    losses["loss"].backward()
    nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm, foreach=True)
    optimizer.step()
    return losses


def ppo_minibatch(continuous, rng, B=96, obs_dim=5, action_dim=3):
    """A minibatch whose stored log-probs and values are perturbed, so that some ratios and
    values fall outside the clip range and every branch of the loss is taken."""
    from rlstore.storage import RolloutBatch

    obs = torch.from_numpy(rng.normal(size=(B, obs_dim)).astype(np.float32))
    if continuous:
        actions = torch.from_numpy(rng.normal(size=(B, action_dim)).astype(np.float32))
    else:
        actions = torch.from_numpy(rng.integers(0, action_dim, B))
    noise = lambda scale: torch.from_numpy((rng.normal(size=B) * scale).astype(np.float32))  # noqa: E731
    return RolloutBatch(obs, actions, noise(0.3) - 1.2, noise(1.0), noise(1.0), noise(2.0))


@pytest.fixture
def general_steps(monkeypatch) -> list:
    """One item per call of Run.record_step: only the loop's own step calls it."""
    from rlstore.run import Run

    calls, record_step = [], Run.record_step

    def counted(run, *args):
        calls.append(1)
        return record_step(run, *args)

    monkeypatch.setattr(Run, "record_step", counted)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize(
    "env_id, sign_rewards",
    [
        ("CartPole-v1", False),
        ("Taxi-v4", False),  # under its action masks, from info["action_mask"]
        ("tests.space_envs:MethodMaskedBox-v0", False),  # masks from action_masks()
        pytest.param("LunarLander-v3", True, marks=requires_extra("box2d", "Box2D")),
    ],
)
def test_one_env_dqn_step_is_the_loops_step(
    tmp_path, monkeypatch, general_steps, env_id, sign_rewards
):
    """A one-env DQN run through LeanDQNStep ends bit for bit where the loop's own calls
    end: the same replay buffer (wrapped around), episodes, parameters and numpy RNG state,
    with episodes ended by termination and by the time limit (and learnt by sign), and
    under action masks the same masks stored."""
    from rlstore.algos import dqn
    from rlstore.algos.dqn import DQNConfig

    def train(fast: bool):
        if not fast:
            monkeypatch.setattr(LeanDQNStep, "supports", staticmethod(lambda *args: False))
        general_steps.clear()
        seen = {}
        cfg = DQNConfig(
            env_id=env_id,
            total_timesteps=3000,
            learning_starts=500,
            buffer_size=700,
            batch_size=32,
            max_episode_steps=40,
            sign_rewards=sign_rewards,
            seed=5,
            device="cpu",
            progress=False,
            track_tensorboard=False,
            logdir=str(tmp_path / str(fast)),
        )
        result = dqn.train(cfg, callbacks=[Watch(lambda run: seen.update(run.state.parts))])
        return result, seen["buffer"].state_dict(), np.random.get_state(), len(general_steps)

    fast, plain = train(fast=True), train(fast=False)
    assert fast[3] == 1 and plain[3] == 3000  # the fresh buffer's first step went the loop's way
    assert fast[0].episode_returns == plain[0].episode_returns
    assert fast[0].episode_lengths == plain[0].episode_lengths
    assert fast[0].episode_steps == plain[0].episode_steps
    assert any(length < 40 for length in fast[0].episode_lengths) or env_id != "CartPole-v1"
    assert 40 in fast[0].episode_lengths  # truncations
    for p, q in zip(fast[0].model.parameters(), plain[0].model.parameters(), strict=True):
        assert torch.equal(p, q)
    for name, value in plain[1].items():
        assert same_tree(value, fast[1][name]), name
    for a, b in zip(fast[2], plain[2], strict=True):
        assert np.array_equal(a, b)


def same_tree(a, b) -> bool:
    """Tensors, arrays and Python values, or tuples of them (a buffer's observations with
    their masks), equal entry by entry."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return bool(np.all(a == b))


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize(
    "clip_vloss, norm_adv, max_grad_norm",
    [(True, True, 0.5), (False, False, 0.5), (True, True, 100.0)],
)
def test_host_ppo_step_is_the_torch_step(continuous, clip_vloss, norm_adv, max_grad_norm):
    """Three minibatch steps: parameters, Adam's state and the losses equal those of the
    torch path (ppo_loss, backward, clip_grad_norm_, fused Adam) to float32 rounding."""
    import copy

    from rlstore.algos.ppo import PPOConfig
    from rlstore.host_updates import HostPPOStep

    cfg = PPOConfig(
        clip_vloss=clip_vloss,
        norm_adv=norm_adv,
        max_grad_norm=max_grad_norm,
        ent_coef=0.05,
        clip_coef=0.2,
    )
    torch.manual_seed(4)
    agent = ActorCritic(5, 3, continuous=continuous)
    twin = copy.deepcopy(agent)
    opt = torch.optim.Adam(agent.parameters(), lr=3e-3, eps=1e-5, fused=True)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=3e-3, eps=1e-5, fused=True)
    assert HostPPOStep.supports(twin, twin_opt)
    fast = HostPPOStep(twin, twin_opt)
    rng = np.random.default_rng(5)
    for _ in range(3):
        batch = ppo_minibatch(continuous, rng)
        expected = reference_ppo_step(agent, opt, batch, cfg)
        got = fast(batch, cfg)
        assert got.keys() == expected.keys()
        for key in got:
            torch.testing.assert_close(got[key], expected[key].detach(), rtol=1e-4, atol=1e-5)
        for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
            for name in ("exp_avg", "exp_avg_sq", "step"):
                torch.testing.assert_close(
                    twin_opt.state[q][name], opt.state[p][name], rtol=1e-3, atol=1e-7
                )
    assert not HostPPOStep.supports(agent, torch.optim.SGD(agent.parameters(), lr=0.1))


@pytest.mark.parametrize(
    "loss, double_dqn, prioritized, max_grad_norm, masked",
    [
        ("mse", False, False, None, False),
        ("huber", True, True, 10.0, False),
        ("huber", False, False, 0.1, False),
        ("mse", False, False, None, True),
        ("huber", True, True, 10.0, True),
    ],
)
def test_host_dqn_step_is_the_torch_step(loss, double_dqn, prioritized, max_grad_norm, masked):
    """Three gradient steps: parameters, loss, TD errors and Q(s, a) equal the
    torch path's (td_loss, backward, clipping, fused Adam) to float32 rounding; with action
    masks too (some next states allowing one action, some none)."""
    import copy

    from rlstore.algos.dqn import DQNConfig, td_loss
    from rlstore.host_updates import HostDQNStep
    from rlstore.storage.replay import ReplayBatch

    cfg = DQNConfig(
        loss=loss, double_dqn=double_dqn, prioritized=prioritized, max_grad_norm=max_grad_norm
    )
    torch.manual_seed(6)
    q, target = QNetwork(4, 3), QNetwork(4, 3)  # a target that differs from the online net
    twin, twin_target = copy.deepcopy(q), copy.deepcopy(target)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2, fused=True)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-2, fused=True)
    assert HostDQNStep.supports(twin, twin_opt)
    assert not HostDQNStep.supports(QNetwork(4, 3, dueling=True), twin_opt)
    assert not HostDQNStep.supports(CnnQNetwork((4, 36, 36), 3), twin_opt)
    fast = HostDQNStep(twin, twin_target, twin_opt)
    rng = np.random.default_rng(7)
    f32 = lambda *shape: torch.from_numpy(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    for _ in range(3):
        B = 64
        batch = ReplayBatch(
            obs=f32(B, 4),
            actions=torch.from_numpy(rng.integers(0, 3, B)),
            rewards=f32(B) * 3,
            next_obs=f32(B, 4),
            terminated=torch.from_numpy(rng.random(B) < 0.2),
            discounts=torch.full((B,), 0.99**2),
            weights=f32(B).abs(),
            indices=torch.arange(B),
        )
        if masked:
            allowed = rng.random((B, 3)) < 0.5
            allowed[:4] = False  # no action allowed: no bootstrap
            allowed[4:8] = [True, False, False]  # one allowed: its value, whatever the max
            allowed = torch.from_numpy(allowed)
            batch = batch._replace(action_masks=torch.ones(B, 3, dtype=bool))
            batch = batch._replace(next_action_masks=allowed)
        expected = td_loss(q, target, batch, cfg)
        opt.zero_grad()
        expected[0].backward()
        if max_grad_norm is not None:
            nn.utils.clip_grad_norm_(q.parameters(), max_grad_norm, foreach=True)
        opt.step()
        got = fast(
            batch._replace(**{k: v.numpy() for k, v in batch._asdict().items() if v is not None}),
            cfg,
        )
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-5)
        for p, r in zip(q.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(r, p, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("continuous, norm_adv", [(False, False), (True, True)])
def test_host_a2c_step_is_the_torch_step(continuous, norm_adv):
    """Three A2C updates: parameters, RMSprop's state and the losses equal the torch
    path's (a2c_loss, backward, clip_grad_norm_, RMSprop) to float32 rounding."""
    import copy

    from rlstore.algos.a2c import A2CConfig, a2c_loss
    from rlstore.host_updates import HostA2CStep

    cfg = A2CConfig(norm_adv=norm_adv, ent_coef=0.05, max_grad_norm=0.5)
    torch.manual_seed(8)
    agent = ActorCritic(5, 3, continuous=continuous)
    twin = copy.deepcopy(agent)

    def make(net):
        return torch.optim.RMSprop(net.parameters(), lr=7e-3, alpha=0.99, eps=1e-5, foreach=True)

    opt, twin_opt = make(agent), make(twin)
    assert HostA2CStep.supports(twin, twin_opt)
    assert not HostA2CStep.supports(twin, torch.optim.Adam(twin.parameters()))
    fast = HostA2CStep(twin, twin_opt)
    rng = np.random.default_rng(9)
    for _ in range(3):
        batch = ppo_minibatch(continuous, rng, B=20)
        log_prob, entropy, value = agent.evaluate(batch.obs, batch.actions)
        expected = a2c_loss(log_prob, batch.advantages, value, batch.returns, entropy, cfg)
        opt.zero_grad()
        expected["loss"].backward()
        nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm, foreach=True)
        opt.step()
        got = fast(batch, cfg)
        for key in got:
            torch.testing.assert_close(got[key], expected[key].detach(), rtol=1e-4, atol=1e-5)
        # RMSprop divides by sqrt of the squared gradients' average: a rounding difference
        # in a near-zero gradient moves its parameter by up to ~1e-4 of the lr-sized step
        for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-4)
            expected_avg = opt.state[p]["square_avg"]
            torch.testing.assert_close(
                twin_opt.state[q]["square_avg"], expected_avg, rtol=1e-3, atol=1e-8
            )


@pytest.mark.parametrize(
    "make",
    [
        lambda params: torch.optim.Adam(params, lr=1e-2, fused=True),
        lambda params: torch.optim.Adam(params, lr=1e-2, eps=1e-5),
        lambda params: torch.optim.RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-5),
    ],
)
@pytest.mark.parametrize("hooked", [False, True])
def test_optimizer_step_is_the_optimizers_step(make, hooked):
    """optimizer_step updates the parameters and the optimizer's state bit for bit as
    optimizer.step() does, and with a step hook registered runs step() itself (the hook
    is called)."""
    from rlstore.machine import optimizer_step

    torch.manual_seed(3)
    nets = [nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers = [make(net.parameters()) for net in nets]
    calls = []
    if hooked:
        optimizers[1].register_step_post_hook(lambda *args: calls.append(1))
    for _ in range(4):
        x = torch.randn(16, 4)
        for net, optimizer, step in zip(nets, optimizers, ("step", "ours"), strict=True):
            optimizer.zero_grad()
            net(x).square().mean().backward()
            optimizer.step() if step == "step" else optimizer_step(optimizer)
    for p, q in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(p, q)
        for key, value in optimizers[0].state[p].items():
            assert torch.equal(value, optimizers[1].state[q][key]), key
    assert calls == ([1] * 4 if hooked else [])


@pytest.mark.slow
def test_a_run_does_not_import_the_compiler_stack(tmp_path):
    """skip_dynamo_import and optimizer_step: PPO, A2C and DQN runs on small MLPs (numpy
    steps, checkpoints written and read), DQN under Taxi's action masks, and runs whose
    updates step torch optimizers (C51, SAC) never import torch._dynamo, which costs about
    0.9 s at start-up."""
    import subprocess
    import sys

    from rlstore.machine import SKIP_DYNAMO_TORCH_VERSIONS

    if not torch.__version__.startswith(SKIP_DYNAMO_TORCH_VERSIONS):
        pytest.skip(f"skip_dynamo_import runs on torch {SKIP_DYNAMO_TORCH_VERSIONS} only")
    code = f"""
import sys
from rlstore.cli import main
starts = ["--learning-starts", "500"]
runs = [
    ("ppo", []),
    ("a2c", []),
    ("dqn", starts),
    ("dqn", starts + ["--env", "Taxi-v4"]),
    ("c51", starts),
    ("sac", ["--env", "Pendulum-v1", "--learning-starts", "1900"]),
]
for algo, extra in runs:
    args = ["train", algo, "--total-timesteps", "2048", "--logdir", {str(tmp_path)!r}]
    assert main(args + ["--no-progress"] + extra) == 0
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "dynamo imported: False" in out.stdout


@pytest.mark.parametrize(
    "env_id, normalize",
    [
        ("CartPole-v1", False),
        ("Pendulum-v1", False),
        ("Pendulum-v1", True),  # Box actions
        ("CartPole-v1", True),
        ("Taxi-v4", False),  # under its action masks, from info["action_mask"]
        ("tests.space_envs:MethodMaskedBox-v0", False),  # masks from action_masks()
        ("Pendulum-v1", "sign"),  # rewards in (-16.3, 0] learnt by their sign
        ("tests.space_envs:PickTwo-v0", False),  # MultiDiscrete actions from start [1, 0]
    ],
)
def test_lean_rollout_is_the_loops_steps(tmp_path, monkeypatch, general_steps, env_id, normalize):
    """Rollouts collected through LeanRollout leave the storage (its action masks too), the
    vector env, the episode statistics, the normalizers, the run and numpy's RNG bit for
    bit as the loop's own calls leave them, with episodes ended by termination and by the
    time limit, and rewards normalized or learnt by sign; when the env, the storage and the
    statistics disagree on the last step (a checkpoint loaded into one of them), the loop's
    own step goes first, once."""
    from rlstore import algos
    from rlstore.algos._on_policy import build_actor_critic, collect_rollout
    from rlstore.masks import masks_of
    from rlstore.presets import resolve
    from rlstore.run import Run

    def collect(lean: bool) -> list:
        overrides = dict(
            logdir=str(tmp_path / str(lean)),
            device="cpu",
            progress=False,
            track_tensorboard=False,
            max_episode_steps=13,
            num_steps=32,
            seed=3,
            norm_obs=normalize is True,
            norm_reward=normalize is True,
            sign_rewards=normalize == "sign",
        )
        cfg = resolve("ppo", env_id, overrides)[0]
        run = Run(cfg, "ppo")
        agent, storage, state = build_actor_critic(cfg, algos.get("ppo"), run.device)
        assert LeanRollout.supports(state.envs, storage, agent.act_on_host)
        if not lean:
            monkeypatch.setattr(LeanRollout, "supports", staticmethod(lambda *args: False))
        np.random.seed(7)
        general_steps.clear()
        seen = []
        for rollout in range(6):
            if rollout == 3:  # the statistics think that env 1 has just ended an episode
                run.stats.prev_done[1] = True
            collect_rollout(agent, storage, state, run)
            envs, stats = state.envs, run.stats
            seen.append(
                [
                    getattr(storage, name).clone()
                    for name in (
                        "obs",
                        "actions",
                        "log_probs",
                        "values",
                        "rewards",
                        "terminated",
                        "truncated",
                        "life_lost",
                        "valid",
                        "prev_done",
                    )
                ]
                + [None if storage.action_masks is None else storage.action_masks.clone()]
                + [None if masks_of(envs) is None else masks_of(envs).masks.copy()]
                + [
                    storage.step,
                    run.global_step,
                    stats.returns.copy(),
                    stats.lengths.copy(),
                    stats.prev_done.copy(),
                ]
                + [
                    getattr(lean_env_of(envs), name).copy()
                    for name in (
                        "observations",
                        "rewards",
                        "terminations",
                        "truncations",
                        "autoreset",
                    )
                ]
                + [
                    value
                    for part in ("obs_normalizer", "reward_scaler")
                    if part in state.parts
                    for value in state.parts[part].state_dict().values()
                ]
            )
            storage.after_update()
            with torch.no_grad():  # a new policy for the next rollout
                for p in agent.parameters():
                    p.add_(0.1 * torch.randn_like(p))
        episodes = (run.episode_returns, run.episode_lengths, run.episode_steps)
        state.envs.close()
        return seen, episodes, np.random.get_state(), len(general_steps)

    torch.manual_seed(0)
    lean = collect(lean=True)
    torch.manual_seed(0)
    plain = collect(lean=False)
    assert lean[3] == 1 and plain[3] == 6 * 32  # one step of the loop's own, at the mismatch
    for lean_rollout, plain_rollout in zip(lean[0], plain[0], strict=True):
        for a, b in zip(lean_rollout, plain_rollout, strict=True):
            same = torch.equal(a, b) if isinstance(a, torch.Tensor) else np.array_equal(a, b)
            assert same and type(a) is type(b) and getattr(a, "dtype", 0) == getattr(b, "dtype", 0)
    assert lean[1] == plain[1]
    assert 13 in lean[1][1]  # truncations
    if normalize == "sign":  # the storage learns the signs, the episodes count the env's own
        rewards = torch.cat([rollout[4] for rollout in lean[0]])
        assert set(rewards.unique().tolist()) <= {-1.0, 0.0} and -1.0 in rewards
        assert all(ret != round(ret) for ret in lean[1][0])
    if env_id == "CartPole-v1":
        assert any(length < 13 for length in lean[1][1])  # terminations
    for a, b in zip(lean[2], plain[2], strict=True):
        assert np.array_equal(a, b)


# -- the algorithms' own update functions, with their fast step and with their reference --


def filled_rollout(continuous, rng, T=16, N=4, obs_dim=5, action_dim=3):
    """A RolloutStorage of random steps (terminations and truncations among them), its
    returns computed; the stored log-probs are perturbed around an untrained policy's."""
    from rlstore.storage import RolloutStorage

    storage = RolloutStorage(
        T,
        N,
        (obs_dim,),
        (action_dim,) if continuous else (),
        action_dtype=torch.float32 if continuous else torch.int64,
    )
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    storage.reset(f32(N, obs_dim))
    for _ in range(T):
        action = f32(N, action_dim) if continuous else rng.integers(0, action_dim, N)
        storage.insert(
            f32(N, obs_dim),
            action,
            f32(N) * 0.3 - (3.0 if continuous else 1.1),
            f32(N),
            f32(N),
            rng.random(N) < 0.1,
            rng.random(N) < 0.05,
        )
    storage.compute_returns(f32(N), 0.99, 0.95)
    return storage


def assert_same_networks(a, b, rtol=1e-4, atol=1e-5):
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol)


@pytest.mark.parametrize("continuous", [False, True])
@pytest.mark.parametrize("target_kl, epochs_run", [(None, 3), (1e-9, 1), (1e9, 3)])
def test_ppo_update_is_the_same_with_and_without_its_fast_step(continuous, target_kl, epochs_run):
    """ppo_update as it runs (HostPPOStep) and as the reference runs (--fast-paths off: the
    torch branch) end at the same parameters, losses and step count; target_kl stops both
    after the first epoch when the KL estimate is above it, and neither when it is not."""
    import copy
    import dataclasses

    from rlstore.algos.ppo import PPOConfig, ppo_update

    cfg = PPOConfig(update_epochs=3, num_minibatches=4, ent_coef=0.05, target_kl=target_kl)
    torch.manual_seed(10)
    agent = ActorCritic(5, 3, continuous=continuous)
    twin = copy.deepcopy(agent)
    opt, twin_opt = (
        torch.optim.Adam(n.parameters(), lr=3e-3, eps=1e-5, fused=True) for n in (agent, twin)
    )
    storage = filled_rollout(continuous, np.random.default_rng(11))
    torch.manual_seed(12)  # the same minibatch shuffles for both
    fast = ppo_update(agent, opt, storage, cfg)
    torch.manual_seed(12)
    reference = ppo_update(twin, twin_opt, storage, dataclasses.replace(cfg, fast_paths="off"))
    assert_same_networks(agent, twin)
    for key in reference:
        torch.testing.assert_close(fast[key], reference[key].detach(), rtol=1e-4, atol=1e-5)
    steps = {float(state["step"]) for o in (opt, twin_opt) for state in o.state.values()}
    assert steps == {4.0 * epochs_run}


@pytest.mark.parametrize("continuous", [False, True])
def test_a2c_update_is_the_same_with_and_without_its_fast_step(continuous):
    """a2c_update with HostA2CStep and with the torch branch: three updates, the same
    parameters and losses (clipping binds: max_grad_norm is small)."""
    import copy

    from rlstore.algos.a2c import A2CConfig, a2c_update
    from rlstore.host_updates import HostA2CStep

    cfg = A2CConfig(ent_coef=0.05, max_grad_norm=0.1, norm_adv=True)
    torch.manual_seed(13)
    agent = ActorCritic(5, 3, continuous=continuous)
    twin = copy.deepcopy(agent)
    opt, twin_opt = (
        torch.optim.RMSprop(n.parameters(), lr=7e-3, alpha=0.99, eps=1e-5, foreach=True)
        for n in (agent, twin)
    )
    fast_step = HostA2CStep(agent, opt)
    rng = np.random.default_rng(14)
    for _ in range(3):
        data = filled_rollout(continuous, rng).flatten()
        fast = a2c_update(agent, opt, data, cfg, fast_step)
        reference = a2c_update(twin, twin_opt, data, cfg)
        for key in reference:
            torch.testing.assert_close(fast[key], reference[key], rtol=1e-4, atol=1e-5)
        assert_same_networks(agent, twin, atol=1e-4)


@pytest.mark.parametrize("prioritized, max_grad_norm", [(False, 0.1), (True, None)])
def test_dqn_gradient_step_is_the_same_with_and_without_its_fast_step(prioritized, max_grad_norm):
    """gradient_step on a replay buffer, with HostDQNStep and with the torch branch: five
    steps, the same parameters, losses and (with PER) priorities; max_grad_norm binds."""
    import copy

    from rlstore.algos.dqn import DQNConfig, gradient_step
    from rlstore.host_updates import HostDQNStep

    cfg = DQNConfig(
        batch_size=32,
        prioritized=prioritized,
        max_grad_norm=max_grad_norm,
        double_dqn=True,
        loss="huber",
    )
    torch.manual_seed(15)
    q, target = QNetwork(4, 3), QNetwork(4, 3)
    twin, twin_target = copy.deepcopy(q), copy.deepcopy(target)
    opt, twin_opt = (torch.optim.Adam(n.parameters(), lr=1e-2, fused=True) for n in (q, twin))
    buffers = twin_buffers(4, 3, prioritized, seed=16)
    fast_step = HostDQNStep(q, target, opt)
    for _ in range(5):
        loss, q_value = gradient_step(q, target, opt, buffers[0], 0.4, cfg, fast_step)
        twin_loss, twin_q = gradient_step(twin, twin_target, twin_opt, buffers[1], 0.4, cfg)
        torch.testing.assert_close(loss, twin_loss.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(q_value, twin_q, rtol=1e-4, atol=1e-5)
        assert_same_networks(q, twin)
    if prioritized:
        np.testing.assert_allclose(
            buffers[0].priorities.tree.leaves, buffers[1].priorities.tree.leaves, rtol=1e-4
        )


@pytest.mark.parametrize("continuous", [False, True])
def test_the_reference_networks_equal_the_fast_ones(continuous):
    """fast=False (ModuleCalls: the layers called as modules) gives the same values as the
    fast networks from the same state dict, which has the same keys either way."""
    from rlstore.networks import ModuleCalls

    torch.manual_seed(17)
    fast = ActorCritic(5, 3, continuous=continuous)
    reference = ActorCritic(5, 3, continuous=continuous, fast=False)
    assert reference.state_dict().keys() == fast.state_dict().keys()
    reference.load_state_dict(fast.state_dict())
    assert isinstance(reference.actor_path, ModuleCalls) and reference.act_on_host is None
    obs = torch.randn(7, 5)
    actions = torch.randn(7, 3) if continuous else torch.randint(0, 3, (7,))
    for a, b in zip(fast.evaluate(obs, actions), reference.evaluate(obs, actions), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(fast.deterministic_action(obs), reference.deterministic_action(obs))
    q_fast, q_reference = QNetwork(5, 3), QNetwork(5, 3, fast=False)
    assert q_reference.state_dict().keys() == q_fast.state_dict().keys()
    q_reference.load_state_dict(q_fast.state_dict())
    assert torch.equal(q_fast(obs), q_reference(obs))
    np.testing.assert_array_equal(
        q_fast.greedy_action(obs.numpy()), q_reference.greedy_action(obs.numpy())
    )


@pytest.mark.parametrize("algo", ["ppo", "a2c", "dqn"])
def test_fast_paths_off_takes_no_fast_path(algo, tmp_path, monkeypatch):
    """With --fast-paths off a run calls none of the fast paths (each is made to fail here)
    and uses Gymnasium's own vector env; the same run with them on does call them."""
    import gymnasium as gym

    from rlstore import algos
    from rlstore.callbacks import Callback
    from rlstore.host_networks import HostActorCritic
    from rlstore.host_updates import HostA2CStep, HostDQNStep, HostPPOStep
    from rlstore.lean import LeanDQNStep, LeanRollout
    from rlstore.lean_envs import LeanSyncVectorEnv
    from rlstore.presets import resolve

    called = []
    for cls in (
        HostPPOStep,
        HostA2CStep,
        HostDQNStep,
        HostActorCritic,
        GreedyActor,
        LeanDQNStep,
        LeanSyncVectorEnv,
    ):
        method = "step" if cls is LeanSyncVectorEnv else "__call__"
        original = getattr(cls, method)

        def watched(self, *args, _original=original, _name=cls.__name__, **kwargs):
            called.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, method, watched)
    original_collect = LeanRollout.collect
    monkeypatch.setattr(
        LeanRollout,
        "collect",
        lambda self, general_step: (
            called.append("LeanRollout"),
            original_collect(self, general_step),
        ),
    )
    kinds = []

    class EnvKind(Callback):
        def on_iteration(self, run):
            kinds.append(type(run.state.envs))

    def train(fast_paths: str) -> None:
        called.clear()
        kinds.clear()
        extra = {"learning_starts": 500} if algo == "dqn" else {}
        cfg, preset = resolve(
            algo,
            "CartPole-v1",
            dict(
                total_timesteps=1500,
                fast_paths=fast_paths,
                vectorization="sync",
                logdir=str(tmp_path),
                progress=False,
                checkpoint_every=0,
                track_tensorboard=False,
                **extra,
            ),
        )
        algos.get(algo).train(cfg, preset, callbacks=[EnvKind()])

    train("off")
    assert called == [] and set(kinds) == {gym.vector.SyncVectorEnv}
    train("auto")
    assert called and set(kinds) == {LeanSyncVectorEnv}


@pytest.mark.parametrize(
    "kind, dueling", [("quantile", False), ("quantile", True), ("categorical", False)]
)
@pytest.mark.parametrize("use_numpy", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_greedy_actor_of_a_distributional_network_picks_its_q_values_argmax(
    kind, dueling, use_numpy, masked
):
    """QR-DQN's and C51's networks: GreedyActor with outputs_per_action (quantiles, or atom
    logits with the support) picks the argmax of q_values (the quantiles' mean, the atoms'
    expectation), among the allowed actions where masked; the networks whose outputs do
    not order actions so (a noisy head, a dueling categorical one) have no such actor."""
    import gymnasium as gym

    from rlstore.algos._distributional import DistributionalQNetwork
    from rlstore.encoders import encoder_for

    space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
    torch.manual_seed(4)
    network = DistributionalQNetwork(5, kind, 7, (32, 32), encoder_for(space), dueling=dueling)
    actor = network.greedy_actor()
    if not use_numpy:
        actor = GreedyActor(network.advantage_path, False, network.encoder, 7, actor.support)
    rng = np.random.default_rng(4)
    for rows in (1, 4, 256):
        obs = rng.normal(size=(rows, 6)).astype(np.float32) * 3
        masks = random_masks(rng, rows, 5) if masked else None
        expected, clear = torch_greedy(network, obs, masks)
        actions = actor(obs, masks)
        assert actions.dtype == np.int64 and actions.shape == (rows,)
        np.testing.assert_array_equal(actions[clear], expected[clear])
        assert clear.mean() > 0.8
    for options in (dict(kind="categorical", dueling=True), dict(noisy=True)):
        kind = options.pop("kind", "quantile")
        other = DistributionalQNetwork(5, kind, 7, (32, 32), encoder_for(space), **options)
        assert other.greedy_actor() is None
