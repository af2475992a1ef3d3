"""DQN: target network sync steps, epsilon schedule, TD targets, determinism, smoke runs."""

from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import Watch

from rlstore.algos import dqn
from rlstore.algos.dqn import DQNConfig
from rlstore.cli import main
from rlstore.networks import QNetwork
from rlstore.storage.replay import ReplayBatch


def tiny(logdir, **overrides):
    kwargs = dict(
        total_timesteps=3000,
        learning_starts=500,
        target_network_frequency=400,
        batch_size=32,
        buffer_size=1000,
        logdir=logdir,
        device="cpu",
        progress=False,
        track_tensorboard=False,
    )
    return DQNConfig(**{**kwargs, **overrides})


@pytest.mark.parametrize("num_envs", [1, 3])
def test_target_network_changes_exactly_at_sync_steps(num_envs, logdir):
    seen = []

    def watch(run):
        target_network, q_network = run.state.parts["target_model"], run.state.policy
        target = torch.cat([p.flatten() for p in target_network.parameters()]).clone()
        online = torch.cat([p.flatten() for p in q_network.parameters()])
        seen.append((run.global_step, target, torch.equal(target, online)))

    dqn.train(tiny(logdir, num_envs=num_envs), callbacks=[Watch(watch)])
    changed = [
        step for (step, t, _), (_, prev, _) in zip(seen[1:], seen) if not torch.equal(t, prev)
    ]
    expected = []
    for multiple in range(400, 3000 + 1, 400):  # the first step at or past each multiple
        step = next(s for s, _, _ in seen if s >= multiple)
        if step > 500:
            expected.append(step)
    assert changed == expected
    assert all(synced for step, _, synced in seen if step in expected)  # a hard copy


def test_soft_target_updates_move_by_tau(logdir):
    seen = []

    def watch(run):
        target_network, q_network = run.state.parts["target_model"], run.state.policy
        seen.append(
            (
                run.global_step,
                [p.clone() for p in target_network.parameters()],
                [p.clone() for p in q_network.parameters()],
            )
        )

    dqn.train(tiny(logdir, tau=0.5, total_timesteps=1300), callbacks=[Watch(watch)])
    before = next(t for step, t, _ in seen if step == 1199)
    after, online = next((t, q) for step, t, q in seen if step == 1200)
    for b, a, q in zip(before, after, online):
        torch.testing.assert_close(a, b + 0.5 * (q - b))


def test_epsilon_at_chosen_steps(logdir, monkeypatch):
    """The epsilon each step acted with, as the loop logs it (every step here)."""
    from rlstore.callbacks import Callback
    from rlstore.run import Run

    eps = {}

    class Logged(Callback):
        def on_log(self, run, scalars):  # logged after the step it acted at
            eps.setdefault(run.global_step - 1, scalars["charts/epsilon"])

    monkeypatch.setattr(Run, "LOG_EVERY_STEPS", 1)
    dqn.train(tiny(logdir), callbacks=[Logged()])
    assert eps[0] == 1.0
    assert eps[750] == pytest.approx(1.0 - 0.5 * 0.95)  # halfway through 0.5 x 3000 steps
    assert eps[1500] == 0.05 and eps[2999] == 0.05


@pytest.mark.parametrize("num_envs", [1, 3])
def test_epsilon_greedy_against_a_naive_reference(num_envs):
    """Each env explores when its coin is below epsilon, then takes floor(u * num_actions)
    from its second uniform; the others act greedily. Same RNG stream as the reference."""

    def greedy(obs):
        return obs[:, 0].astype(np.int64)  # the 'greedy' action is written in the obs

    def reference(obs, epsilon, num_actions):
        coins = np.random.random((2, len(obs)))
        explore = coins[0] < epsilon
        return np.where(explore, np.floor(coins[1] * num_actions).astype(np.int64), greedy(obs))

    rng = np.random.default_rng(0)
    for epsilon in (0.0, 0.3, 1.0):
        np.random.seed(7)
        obs = rng.integers(0, 4, (200, num_envs, 1)).astype(np.float32)
        ours = [dqn.epsilon_greedy(greedy, o, epsilon, 4) for o in obs]
        np.random.seed(7)
        expected = [reference(o, epsilon, 4) for o in obs]
        for a, b in zip(ours, expected, strict=True):
            assert a.dtype == np.int64 and a.shape == (num_envs,)
            np.testing.assert_array_equal(a, b)
        explored = np.mean([(a != o[:, 0]).mean() for a, o in zip(ours, obs, strict=True)])
        assert (explored == 0) if epsilon == 0 else explored > 0


def test_td_targets_hand_computed():
    q = QNetwork(1, 2, hidden=())
    target = QNetwork(1, 2, hidden=())
    with torch.no_grad():
        q.advantage.weight.zero_()
        q.advantage.bias.copy_(torch.tensor([1.0, 3.0]))  # online prefers action 1
        target.advantage.weight.zero_()
        target.advantage.bias.copy_(torch.tensor([5.0, 2.0]))  # target prefers action 0
    batch = ReplayBatch(
        obs=torch.zeros(2, 1),
        actions=torch.tensor([0, 1]),
        rewards=torch.tensor([1.0, 1.0]),
        next_obs=torch.zeros(2, 1),
        terminated=torch.tensor([False, True]),
        discounts=torch.tensor([0.5, 0.5]),
        weights=torch.ones(2),
        indices=torch.arange(2),
    )
    _, td, qv = dqn.td_loss(q, target, batch, DQNConfig())
    # targets: 1 + 0.5 * 5 = 3.5 and 1 (terminated); Q(s, a) = [1, 3]
    torch.testing.assert_close(qv, torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(td, torch.tensor([1.0 - 3.5, 3.0 - 1.0]))
    _, td, _ = dqn.td_loss(q, target, batch, DQNConfig(double_dqn=True))
    torch.testing.assert_close(td, torch.tensor([1.0 - 2.0, 2.0]))  # 1 + 0.5 * Q_target(a'=1)
    loss, _, _ = dqn.td_loss(q, target, batch, DQNConfig(loss="huber"))
    assert loss.item() == pytest.approx((2.0 + 1.5) / 2)  # |td| - 0.5 for |td| > 1
    loss, _, _ = dqn.td_loss(q, target, batch, DQNConfig())
    assert loss.item() == pytest.approx((2.5**2 + 2.0**2) / 2)
    weighted = batch._replace(weights=torch.tensor([1.0, 0.5]))
    loss, _, _ = dqn.td_loss(q, target, weighted, DQNConfig(prioritized=True))
    assert loss.item() == pytest.approx((2.5**2 + 0.5 * 2.0**2) / 2)  # importance-weighted


def test_dueling_head_is_value_plus_centred_advantage():
    net = QNetwork(3, 4, dueling=True)
    obs = torch.randn(5, 3)
    x = net.body(obs)
    adv = net.advantage(x)
    torch.testing.assert_close(net(obs), net.value(x) + adv - adv.mean(-1, keepdim=True))


@pytest.mark.slow
def test_same_seed_same_run(logdir):
    runs = [dqn.train(tiny(logdir, seed=s, prioritized=True, n_step=2)) for s in (3, 3, 4)]
    assert runs[0].episode_returns == runs[1].episode_returns
    for p, q in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        assert torch.equal(p, q)
    assert runs[0].episode_returns != runs[2].episode_returns


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--n-step", "3", "--prioritized"],
        [
            "--double-dqn",
            "--dueling",
            "--loss",
            "huber",
            "--num-envs",
            "2",
            "--max-grad-norm",
            "10",
        ],
    ],
)
def test_cli_smoke(flags, logdir):
    args = [
        "train",
        "dqn",
        "--total-timesteps",
        "1500",
        "--learning-starts",
        "500",
        "--logdir",
        logdir,
        "--no-progress",
        *flags,
    ]
    assert main(args) == 0
    if not flags:  # the event file holds DQN's scalars
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        (run_dir,) = list(Path(logdir).iterdir())
        events = EventAccumulator(str(run_dir))
        events.Reload()
        assert {
            "losses/td_loss",
            "losses/q_values",
            "charts/epsilon",
            "charts/SPS",
            "charts/episodic_return",
        } <= set(events.Tags()["scalars"])


def test_the_buffer_check_counts_observations_where_the_buffer_lives(monkeypatch):
    """With --buffer-device cuda the observations go to the GPU's memory, the rest to the
    host's; each is checked against its own device (no GPU needed: memory is faked)."""
    import gymnasium as gym
    import numpy as np
    import torch

    from rlstore import machine
    from rlstore.algos.dqn import DQNConfig, check_buffer_fits
    from rlstore.errors import UsageError
    from rlstore.storage.replay import ReplayBuffer

    cfg = DQNConfig(buffer_size=100_000)
    space = gym.spaces.Box(-1, 1, (64,), np.float32)
    obs_bytes, host_bytes = ReplayBuffer.memory_bytes(100_000, 1, (64,), np.float32)
    free = {"cpu": host_bytes + 1, "cuda": obs_bytes - 1}
    monkeypatch.setattr(machine, "available_memory", lambda device: free[device.type])
    with pytest.raises(UsageError, match="of cuda memory.*--buffer-device cpu"):
        check_buffer_fits(cfg, space, torch.device("cuda"), frames=False)
    free["cuda"] = obs_bytes
    check_buffer_fits(cfg, space, torch.device("cuda"), frames=False)  # fits exactly
    with pytest.raises(UsageError, match="of host memory"):  # all of it on the host
        check_buffer_fits(cfg, space, torch.device("cpu"), frames=False)
