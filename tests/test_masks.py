"""Action masks (rlstore/masks.py): masked sampling against torch.distributions on the
renormalized policy, the storages keeping each observation's mask with it, DQN's target
over the next state's allowed actions against a naive loop, the update seeing the masks
collection saw, and envs that raise on a masked action trained end to end."""

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 (registers the test envs)
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_replay_buffer import naive_n_step, scalar_stream
from tiny_runs import SETUPS, replace, resumes_bitwise

import rlstore
from rlstore import ReplayBuffer, RolloutStorage
from rlstore.action_heads import MultiCategoricalHead, inverse_cdf
from rlstore.algos.dqn import DQNConfig, td_loss
from rlstore.errors import UsageError
from rlstore.evaluate import evaluate
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.masks import ActionMasks, mask_source
from rlstore.networks import QNetwork, sample_categorical
from rlstore.storage.replay import ReplayBatch


def random_masks(rng, rows, width):
    """Masks with at least one allowed action per row."""
    masks = rng.random((rows, width)) < 0.5
    masks[np.arange(rows), rng.integers(0, width, rows)] = True
    return masks


def test_masked_categorical_samples_the_renormalized_policy():
    """Frequencies of 40k draws per row within 5 sigma of softmax over the allowed actions;
    a masked action is never drawn; log-probs are torch.distributions' on masked logits."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    logits = torch.randn(4, 5) * 2
    mask = torch.from_numpy(random_masks(rng, 4, 5))
    draws = 40_000
    actions, log_probs = sample_categorical(logits.repeat(draws, 1), mask.repeat(draws, 1))
    actions = actions.view(draws, 4)
    allowed = torch.where(mask, logits, -torch.inf).softmax(-1)
    for row in range(4):
        counts = torch.bincount(actions[:, row], minlength=5).double()
        p = allowed[row].double()
        sigma = (draws * p * (1 - p)).sqrt()
        assert (counts[~mask[row]] == 0).all()
        assert ((counts - draws * p).abs() <= 5 * sigma + 1e-9).all()
    reference = torch.distributions.Categorical(logits=torch.where(mask, logits, -torch.inf))
    torch.testing.assert_close(log_probs.view(draws, 4)[0], reference.log_prob(actions[0]))


def test_multi_discrete_masks_apply_per_sub_action():
    torch.manual_seed(1)
    head = MultiCategoricalHead([3, 2])
    logits = torch.randn(1, 5).repeat(20_000, 1)
    mask = torch.tensor([[False, True, True, True, False]]).repeat(20_000, 1)
    actions, log_prob = head.sample(logits, mask)
    assert (actions[:, 0] != 0).all() and (actions[:, 1] == 0).all()
    got_lp, entropy = head.log_prob_and_entropy(logits.masked_fill(~mask, -1e8), actions)
    first = torch.distributions.Categorical(logits=logits[0, :3].masked_fill(~mask[0, :3], -1e9))
    torch.testing.assert_close(got_lp, first.log_prob(actions[:, 0]))  # the second is certain
    torch.testing.assert_close(entropy[0], first.entropy(), rtol=1e-5, atol=1e-6)
    assert (head.mode(logits[:1], mask[:1]) != torch.tensor([[0, 1]])).any()


def test_a_draw_above_a_rounded_total_takes_the_last_allowed_action(monkeypatch):
    """Probabilities summing to a little under 1 and a uniform draw above that sum: the
    sample is the last allowed action, never the masked action after it."""
    log_probs = torch.tensor([[0.3, 0.6, 0.0]]).log()  # sums to 0.9
    monkeypatch.setattr(torch, "rand", lambda *shape, device=None: torch.full(shape, 0.95))
    assert inverse_cdf(log_probs, torch.tensor([[True, True, False]])).item() == 1
    assert inverse_cdf(log_probs).item() == 2  # (no mask: the last action, as before)


# -- the storages keep each observation's mask -------------------------------------------------


def mask_of(ids):
    """A mask that is a function of an observation id, so a mask from another slot shows."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    bits = (ids[:, None] >> np.arange(4)) & 1
    bits[:, 0] = 1  # at least one action allowed
    return bits.astype(bool)


class MaskedStream:
    """ReplayBuffer.add that passes the masks of obs and next_obs (tests/test_replay_buffer's
    scalar_stream calls it as it calls a buffer's add)."""

    def __init__(self, buffer):
        self.buffer, self.num_envs = buffer, buffer.num_envs

    def add(self, obs, action, reward, next_obs, term, trunc):
        self.buffer.add(
            obs,
            action,
            reward,
            next_obs,
            term,
            trunc,
            action_mask=mask_of(obs),
            next_action_mask=mask_of(next_obs),
        )


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 4),
    num_envs=st.integers(1, 3),
    steps=st.integers(1, 30),
    done_prob=st.floats(0.0, 0.5),
    reset_prob=st.sampled_from([0.0, 0.2]),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_replay_keeps_the_mask_of_obs_and_of_the_bootstrap_obs(
    n, num_envs, steps, done_prob, reset_prob, prioritized, seed
):
    """Each sampled transition's masks are those of its obs and of its n-step bootstrap
    observation (the true final one at a truncation), over dones, resets and PER."""
    rng = np.random.default_rng(seed)
    buffer = ReplayBuffer(
        1000,
        num_envs,
        (1,),
        n_step=n,
        gamma=0.9,
        seed=seed,
        prioritized=prioritized,
        action_mask_shape=(4,),
    )
    transitions = scalar_stream(MaskedStream(buffer), steps, rng, done_prob, reset_prob=reset_prob)
    expected = naive_n_step(transitions, n, 0.9)
    batch = buffer.sample(2000)
    obs, next_obs = batch.obs[:, 0].numpy(), batch.next_obs[:, 0].numpy()
    np.testing.assert_array_equal(next_obs, [expected[o][1] for o in obs.tolist()])
    np.testing.assert_array_equal(batch.action_masks.numpy(), mask_of(obs))
    np.testing.assert_array_equal(batch.next_action_masks.numpy(), mask_of(next_obs))
    host = buffer.sample_host(64)
    np.testing.assert_array_equal(host.next_action_masks, mask_of(host.next_obs[:, 0]))
    obs_bytes = buffer.memory_bytes(1000, num_envs, (1,), action_mask_shape=(4,))[0]
    assert obs_bytes == buffer.obs[0].nbytes + buffer.obs[1].nbytes


def test_replay_with_masks_refuses_adds_without_them():
    buffer = ReplayBuffer(10, 1, (1,), action_mask_shape=(4,))
    one, no = np.zeros((1, 1), np.float32), np.zeros(1, bool)
    with pytest.raises(ValueError, match="action_mask and next_action_mask must be given"):
        buffer.add(one, np.zeros(1, np.int64), np.zeros(1), one, no, no)
    with pytest.raises(TypeError, match="next_action_mask has dtype torch.float32"):
        float_mask = np.ones((1, 4), np.float32)
        buffer.add(
            one,
            np.zeros(1, np.int64),
            np.zeros(1),
            one,
            no,
            no,
            action_mask=mask_of([0]),
            next_action_mask=float_mask,
        )


def test_rollout_minibatches_carry_each_observations_mask():
    T, N = 5, 3
    rng = np.random.default_rng(2)
    storage = RolloutStorage(T, N, (1,), action_mask_shape=(4,))
    ids = rng.integers(0, 16, (T + 1, N))
    storage.reset(ids[0, :, None].astype(np.float32), mask_of(ids[0]))
    for t in range(T):
        done = rng.random(N) < 0.3
        storage.insert(
            ids[t + 1, :, None].astype(np.float32),
            np.zeros(N, np.int64),
            np.zeros(N, np.float32),
            np.zeros(N, np.float32),
            np.zeros(N),
            done,
            np.zeros(N, bool),
            action_mask=mask_of(ids[t + 1]),
        )
    storage.compute_returns(np.zeros(N, np.float32), 0.99, 0.95)
    for batch in storage.minibatches(2):
        np.testing.assert_array_equal(batch.action_masks.numpy(), mask_of(batch.obs[:, 0]))
    with pytest.raises(ValueError, match="action_mask must be given exactly"):
        storage.after_update()
        storage.insert(*([np.zeros((N, 1), np.float32)] + [np.zeros(N)] * 4 + [done, done]))


# -- DQN's target --------------------------------------------------------------------------------


@pytest.mark.parametrize("double_dqn", [False, True])
def test_dqn_target_maximizes_over_the_next_states_allowed_actions(double_dqn):
    """Against a row-by-row loop; a terminated next state that allows nothing adds 0."""
    torch.manual_seed(3)
    rng = np.random.default_rng(3)
    B, A = 32, 4
    online, target = QNetwork(3, A, (16,)), QNetwork(3, A, (16,))
    next_masks = random_masks(rng, B, A)
    next_masks[0] = False  # a final observation with no allowed action...
    terminated = rng.random(B) < 0.3
    terminated[0] = True  # ...at a termination
    batch = ReplayBatch(
        obs=torch.randn(B, 3),
        actions=torch.from_numpy(rng.integers(0, A, B)),
        rewards=torch.randn(B),
        next_obs=torch.randn(B, 3),
        terminated=torch.from_numpy(terminated),
        discounts=torch.full((B,), 0.9),
        weights=torch.ones(B),
        indices=torch.arange(B),
        action_masks=torch.from_numpy(random_masks(rng, B, A)),
        next_action_masks=torch.from_numpy(next_masks),
    )
    cfg = DQNConfig(double_dqn=double_dqn, loss="mse")
    _, td_error, q_value = td_loss(online, target, batch, cfg)
    with torch.no_grad():
        q_next_target, q_next_online = target(batch.next_obs), online(batch.next_obs)
    for i in range(B):
        allowed = np.flatnonzero(next_masks[i])
        if terminated[i]:
            bootstrap = 0.0
        elif double_dqn:
            best = allowed[int(np.argmax(q_next_online[i, allowed].numpy()))]
            bootstrap = float(q_next_target[i, best])
        else:
            bootstrap = float(q_next_target[i, allowed].max())
        expected = float(batch.rewards[i]) + 0.9 * bootstrap
        assert float(q_value[i] - td_error[i]) == pytest.approx(expected, abs=1e-5)


# -- envs -------------------------------------------------------------------------------------


def test_action_masks_reads_either_convention_and_checks_them():
    pick = gym.vector.SyncVectorEnv([lambda: gym.make("space_envs:MaskedPick-v0")] * 2)
    single = gym.make("space_envs:MaskedPick-v0")
    assert mask_source(single, single.reset(seed=0)[1]) == "info"
    envs = ActionMasks(pick, "info")
    obs, _ = envs.reset(seed=0)
    assert envs.masks.dtype == bool and envs.masks[np.arange(2), obs].all()
    pair = gym.make("space_envs:MaskedPair-v0")
    assert mask_source(pair, pair.reset(seed=0)[1]) == "method"
    pairs = ActionMasks(
        gym.vector.SyncVectorEnv([lambda: gym.make("space_envs:MaskedPair-v0")]), "method"
    )
    pairs.reset(seed=1)
    assert (
        pairs.masks.shape == (1, 5) and pairs.masks[0, 3:].all() and pairs.masks[0, :3].sum() == 2
    )
    with pytest.raises(UsageError, match=r"are int64 of shape \(3,\) per env"):
        envs._read({"action_mask": np.ones((2, 3), np.int64)}, np.zeros(2, bool))
    nothing = np.zeros((2, 4), bool)
    with pytest.raises(UsageError, match="env 0's action mask allows no action"):
        envs._read({"action_mask": nothing}, np.zeros(2, bool))
    envs._read({"action_mask": nothing}, np.ones(2, bool))  # done envs need not allow one
    box = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")])
    with pytest.raises(UsageError, match="not Box"):
        ActionMasks(box, "info")


def test_read_envs_reads_and_checks_masks_as_a_vector_step_does():
    """ActionMasks.read_envs, the lean loops' door: the masks of envs stepped outside the
    vector env, from their infos or their action_masks(), kept as `masks` and checked as
    _read checks a vector step's: a missing mask, one of the wrong width, one allowing no
    action at a live step, and envs whose masks differ in shape are one line each."""
    envs = ActionMasks(
        gym.vector.SyncVectorEnv([lambda: gym.make("space_envs:MaskedPick-v0")] * 2), "info"
    )
    envs.reset(seed=0)
    inner = envs.env.envs
    infos = [{"action_mask": np.array([1, 0, 1, 1], np.int8)}, {"action_mask": np.ones(4, bool)}]
    masks = envs.read_envs(inner, infos, [False, False])
    assert masks is envs.masks and masks.dtype == bool
    assert masks.tolist() == [[True, False, True, True], [True] * 4]
    with pytest.raises(UsageError, match=r"gave no info\['action_mask'\]"):
        envs.read_envs(inner, [infos[0], {}], [False, False])
    with pytest.raises(UsageError, match=r"of shape \(3,\) per env"):
        envs.read_envs(inner, [{"action_mask": np.ones(3, bool)}] * 2, [False, False])
    with pytest.raises(UsageError, match="differ in shape"):
        envs.read_envs(inner, [infos[0], {"action_mask": np.ones(3, bool)}], [False, False])
    nothing = [{"action_mask": np.zeros(4, bool)}] * 2
    with pytest.raises(UsageError, match="env 1's action mask allows no action"):
        envs.read_envs(inner, nothing, [True, False])
    assert not envs.read_envs(inner, nothing, [True, True]).any()  # done envs need not
    method = ActionMasks(
        gym.vector.SyncVectorEnv([lambda: gym.make("space_envs:MethodMaskedBox-v0")]), "method"
    )
    method.reset(seed=2)
    env = method.env.envs[0]
    expected = env.unwrapped.action_masks()
    assert method.read_envs([env], [{}], [False]).tolist() == [expected.tolist()]


@pytest.mark.parametrize(
    "algo, env_id, fast_paths",
    [
        ("ppo", "MaskedPair-v0", "auto"),
        ("ppo", "MaskedPick-v0", "off"),  # the reference: torch acting, Gymnasium's envs
        ("dqn", "MaskedPick-v0", "auto"),
        ("dqn", "MaskedPick-v0", "off"),
        ("ppo_lstm", "MaskedPair-v0", "auto"),
        ("a2c", "MaskedPick-v0", "auto"),
        ("c51", "MaskedPick-v0", "auto"),
        ("qrdqn", "MaskedPick-v0", "auto"),
        ("rainbow", "MaskedPick-v0", "auto"),
        ("pqn", "MaskedPick-v0", "auto"),
    ],
)
def test_a_masked_run_resumes_bitwise_and_plays_under_masks(
    algo, env_id, fast_paths, tmp_path, monkeypatch
):
    """The envs raise on a masked action: collection, exploration and evaluation never
    take one, with the fast paths and without them; the masks are saved with the run
    (storage, env wrapper) and restored."""
    from rlstore import env_snapshots

    monkeypatch.setattr(
        env_snapshots, "SAVEABLE_ENVS", env_snapshots.SAVEABLE_ENVS + ("MaskedPick", "MaskedPair")
    )
    module, cfg = SETUPS[algo]
    cfg = replace(
        cfg,
        env_id=f"space_envs:{env_id}",
        logdir=str(tmp_path),
        max_episode_steps=None,
        fast_paths=fast_paths,
    )
    full = resumes_bitwise(module, cfg)
    policy = rlstore.load_policy(full.run_dir)
    assert policy.mask_source == ("method" if env_id == "MaskedPair-v0" else "info")
    if env_id == "MaskedPick-v0":
        masks = np.array([[False, True, True, True], [True, False, False, False]])
        actions = policy(np.array([0, 1]), action_mask=masks)
        assert masks[np.arange(2), actions].all()
    evaluate(full.run_dir, episodes=3)  # the env raises on a masked action


def test_the_update_sees_the_log_probs_collection_acted_with(tmp_path):
    """Before any update, log-probs recomputed from the storage under its masks equal the
    ones collection stored; without the masks they differ (the test can fail)."""
    from rlstore.algos._on_policy import build_actor_critic, collect_rollout
    from rlstore.algos.ppo import ALGORITHM, PPOConfig
    from rlstore.run import Run

    cfg = PPOConfig(
        env_id="space_envs:MaskedPair-v0",
        num_envs=2,
        num_steps=32,
        total_timesteps=64,
        logdir=str(tmp_path),
        progress=False,
    )
    run = Run(cfg, "ppo", None, None, ())
    agent, storage, state = build_actor_critic(cfg, ALGORITHM, run.device)
    with run.start(state):
        collect_rollout(agent, storage, state, run)
        data = storage.flatten()
        with torch.no_grad():
            masked = agent.evaluate(data["obs"], data["actions"], data["action_masks"])[0]
            unmasked = agent.evaluate(data["obs"], data["actions"])[0]
    torch.testing.assert_close(masked, data["log_probs"])
    assert not torch.allclose(unmasked, data["log_probs"])


def test_masks_off_ignores_them(tmp_path):
    with pytest.raises(ValueError, match="is masked"):
        rlstore.train(
            "ppo",
            env="space_envs:MaskedPick-v0",
            action_masks="off",
            total_timesteps=2048,
            logdir=str(tmp_path),
            progress=False,
        )


def test_the_numpy_fast_paths_act_and_step_under_masks_as_torch():
    """HostActorCritic samples only allowed actions, with torch's log-probs; the numpy PPO
    step on a masked minibatch takes torch's step (rlstore/host_updates.py)."""
    from test_fast import reference_ppo_step

    from rlstore.algos.ppo import PPOConfig
    from rlstore.host_updates import HostPPOStep
    from rlstore.networks import ActorCritic
    from rlstore.storage.rollout import RolloutBatch

    torch.manual_seed(4)
    rng = np.random.default_rng(4)
    agent, twin = ActorCritic(3, 5), ActorCritic(3, 5)
    twin.load_state_dict(agent.state_dict())
    obs = rng.normal(size=(400, 3)).astype(np.float32)
    masks = random_masks(rng, 400, 5)
    action, log_prob, _ = agent.act_on_host(obs, masks)
    assert masks[np.arange(400), action].all()
    with torch.no_grad():
        expected = agent.evaluate(
            torch.from_numpy(obs), torch.from_numpy(action), torch.from_numpy(masks)
        )[0]
    torch.testing.assert_close(torch.from_numpy(log_prob), expected, rtol=1e-5, atol=1e-5)
    cfg = PPOConfig()
    batch = RolloutBatch(
        torch.from_numpy(obs[:64]),
        torch.from_numpy(action[:64]),
        torch.from_numpy(log_prob[:64]) - 0.1,
        torch.randn(64),
        torch.randn(64),
        torch.randn(64),
        torch.from_numpy(masks[:64]),
    )
    optimizers = [torch.optim.Adam(a.parameters(), lr=1e-3, eps=1e-5) for a in (agent, twin)]
    HostPPOStep(agent, optimizers[0])(batch, cfg)
    reference_ppo_step(twin, optimizers[1], batch, cfg)
    for mine, theirs in zip(agent.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


def test_the_numpy_a2c_step_under_masks_is_the_torch_step():
    """a2c_update on a masked rollout with HostA2CStep and with torch: the same parameters
    (the masks reach both; unmasked, the log-probs would differ: the test above)."""
    import copy

    from rlstore.algos.a2c import A2CConfig, a2c_update
    from rlstore.host_updates import HostA2CStep
    from rlstore.networks import ActorCritic

    torch.manual_seed(5)
    rng = np.random.default_rng(5)
    agent = ActorCritic(3, 4)
    twin = copy.deepcopy(agent)
    opt, twin_opt = (torch.optim.RMSprop(n.parameters(), lr=7e-3, eps=1e-5) for n in (agent, twin))
    T, N = 8, 4
    storage = RolloutStorage(T, N, (3,), action_mask_shape=(4,))
    masks = random_masks(rng, N, 4)
    storage.reset(rng.normal(size=(N, 3)).astype(np.float32), masks)
    for _ in range(T):
        action = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
        masks = random_masks(rng, N, 4)
        storage.insert(
            rng.normal(size=(N, 3)).astype(np.float32),
            action,
            rng.normal(size=N).astype(np.float32) - 1,
            np.zeros(N, np.float32),
            rng.normal(size=N),
            rng.random(N) < 0.2,
            np.zeros(N, bool),
            action_mask=masks,
        )
    storage.compute_returns(np.zeros(N, np.float32), 0.99, 0.95)
    data, cfg = storage.flatten(), A2CConfig(ent_coef=0.05)
    fast = a2c_update(agent, opt, data, cfg, HostA2CStep(agent, opt))
    reference = a2c_update(twin, twin_opt, data, cfg)
    for key in reference:
        torch.testing.assert_close(fast[key], reference[key], rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(agent.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


# -- the defects an independent check found (issue 78) ----------------------------------------


def test_the_lean_sync_vector_env_calls_its_envs_methods_as_gymnasiums_does():
    make = [lambda: gym.make("space_envs:MethodMaskedBox-v0")] * 3
    lean, sync = LeanSyncVectorEnv(make), gym.vector.SyncVectorEnv(make)
    lean.reset(seed=4), sync.reset(seed=4)
    for got, expected in zip(lean.call("action_masks"), sync.call("action_masks"), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert lean.get_attr("forbidden") == sync.get_attr("forbidden")


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_masks_from_an_action_masks_method_apply_with_the_default_vector_env(algo, tmp_path):
    """sb3-contrib's convention with the defaults (fast paths on: the lean sync vector env);
    the env raises on a masked action, in training and in evaluation."""
    options = dict(learning_starts=128, buffer_size=512) if algo == "dqn" else dict(num_steps=32)
    result = rlstore.train(
        algo,
        env="space_envs:MethodMaskedBox-v0",
        total_timesteps=512,
        logdir=str(tmp_path),
        progress=False,
        **options,
    )
    assert rlstore.load_policy(result.run_dir).mask_source == "method"
    evaluate(result.run_dir, episodes=2)


def test_pqn_max_q_is_zero_where_a_mask_allows_no_action():
    from rlstore.algos.pqn import max_q

    q = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    allowed = torch.tensor([[True, True, False], [False, False, False]])
    value, greedy = max_q(lambda obs: q, None, allowed)
    assert value.tolist() == [2.0, 0.0] and int(greedy[0]) == 1


def test_pqn_stays_finite_when_a_terminal_mask_allows_no_action(tmp_path):
    result = rlstore.train(
        "pqn",
        env="space_envs:DeadEnd-v0",
        total_timesteps=1024,
        num_envs=2,
        num_steps=64,
        logdir=str(tmp_path),
        progress=False,
    )
    policy = rlstore.load_policy(result.run_dir)
    assert np.isfinite(policy.q_values(np.zeros((3, 1), np.float32))).all()
    assert all(torch.isfinite(p).all() for p in policy.network.state_dict().values())


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_a_discrete_action_space_with_a_start_gets_its_own_actions(algo, tmp_path):
    """Discrete(3, start=5): the env raises on anything outside 5..7, in training and
    evaluation; the saved policy answers in 5..7 and learns action 5 + state."""
    options = dict(learning_starts=200, buffer_size=1000) if algo == "dqn" else {}
    result = rlstore.train(
        algo,
        env="space_envs:StartedActions-v0",
        total_timesteps=4096,
        logdir=str(tmp_path),
        progress=False,
        **options,
    )
    evaluate(result.run_dir, episodes=2)
    actions = rlstore.load_policy(result.run_dir)(np.array([0, 1, 2]))
    assert actions.tolist() == [5, 6, 7]
