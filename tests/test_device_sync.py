"""The GPU path makes no host/device synchronisation in the loop beyond the env boundary
(and, with prioritized replay, the batch's TD errors, which the host's sum tree takes).

CI has no GPU, so the real loop code (the on-policy collect loop, returns and PPO update;
DQN's acting, replay and gradient step) runs with its tensors on PyTorch's "meta" device:
meta tensors have no data, and anything that reads device data on the host (`.item()`,
`bool(t)`, `.numpy()`, `nonzero`, boolean-mask indexing) raises. The one read allowed is
the env boundary, the `.cpu()` of the actions: the tests stand in for it (on meta it
returns zeros) and count it, once per vector step at most. With a GPU present, the same
code runs on CUDA under torch's sync debug mode, the env boundary alone excepted.

Two torch internals cannot run on meta tensors (the foreach gradient clipping and the
optimizers' step); on meta the tests replace them, on CUDA they run for real.
"""

import contextlib
import copy

import numpy as np
import pytest
import torch
from torch import nn

from rlstore import QNetwork, ReplayBuffer, RolloutStorage, algos
from rlstore.algos._on_policy import build_actor_critic, collect_rollout, compute_returns
from rlstore.algos._shared import update_target
from rlstore.algos.dqn import DQNConfig, epsilon_greedy, gradient_step
from rlstore.algos.ppo import PPOConfig, ppo_update
from rlstore.host_networks import GreedyActor
from rlstore.run import Run

N, T = 4, 16


@pytest.fixture
def env_boundary(monkeypatch):
    """Counts the device -> host copies of the loop; on meta, stands in for them."""
    calls = []
    real_cpu = torch.Tensor.cpu

    def cpu(self, *args, **kwargs):
        if self.device.type == "cpu":
            return real_cpu(self, *args, **kwargs)
        calls.append(tuple(self.shape))
        if self.device.type == "meta":
            return torch.zeros(self.shape, dtype=self.dtype)
        with allowed_sync():
            return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    return calls


@contextlib.contextmanager
def allowed_sync():
    torch.cuda.set_sync_debug_mode("default")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("error")


class NoOptimizer:
    """Stands in for an optimizer on meta tensors, which torch's optimizers refuse."""

    param_groups: list = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


def optimizer_for(model: nn.Module, device: torch.device, monkeypatch):
    if device.type == "meta":
        monkeypatch.setattr(nn.utils, "clip_grad_norm_", lambda *args, **kwargs: None)
        return NoOptimizer()
    return torch.optim.Adam(model.parameters(), fused=True)


def ppo_iteration(device, watch, tmp_path, monkeypatch):
    """Build (copying the network to the device may block), then one iteration of PPO's
    loop under `watch`: collect, returns, update."""
    cfg = PPOConfig(
        num_envs=N,
        num_steps=T,
        num_minibatches=2,
        device="cpu",
        logdir=str(tmp_path),
        progress=False,
        track_tensorboard=False,
    )
    run = Run(cfg, "ppo")  # counts the steps; the parts live on `device`
    agent, storage, state = build_actor_critic(cfg, algos.get("ppo"), device)
    optimizer = optimizer_for(agent, device, monkeypatch)
    try:
        with watch:
            collect_rollout(agent, storage, state, run)
            compute_returns(agent, storage, cfg)
            ppo_update(agent, optimizer, storage, cfg)
            storage.after_update()
    finally:
        state.envs.close()
    assert run.global_step == N * T
    return T  # vector steps taken


def a2c_iteration(device, watch, tmp_path, monkeypatch):
    """One iteration of A2C's loop: collect, returns, and its one step on the flattened
    rollout."""
    from rlstore.algos.a2c import A2CConfig, a2c_update

    cfg = A2CConfig(
        num_envs=N, num_steps=T, device="cpu", logdir=str(tmp_path), progress=False,
        track_tensorboard=False,
    )  # fmt: skip
    run = Run(cfg, "a2c")
    agent, storage, state = build_actor_critic(cfg, algos.get("a2c"), device)
    optimizer = optimizer_for(agent, device, monkeypatch)
    try:
        with watch:
            collect_rollout(agent, storage, state, run)
            compute_returns(agent, storage, cfg)
            a2c_update(agent, optimizer, storage.flatten(), cfg)
            storage.after_update()
    finally:
        state.envs.close()
    return T


def ppo_lstm_iteration(device, watch, tmp_path, monkeypatch):
    """One iteration of recurrent PPO's loop: collect, returns, and epochs of sequence
    minibatches (CartPole's episodes end inside them: on meta every action is 0)."""
    from rlstore.algos import ppo_lstm

    cfg = ppo_lstm.PPOLSTMConfig(
        env_id="CartPole-v1", num_envs=N, num_steps=T, num_minibatches=2, sequence_length=8,
        device="cpu", logdir=str(tmp_path), progress=False, track_tensorboard=False,
    )  # fmt: skip
    run = Run(cfg, "ppo_lstm")
    agent, storage, memory, state = ppo_lstm.build(cfg, device)
    optimizer = optimizer_for(agent, device, monkeypatch)
    try:
        with watch:
            ppo_lstm.collect(agent, storage, state, run)
            ppo_lstm.compute_returns(agent, storage, memory, cfg)
            ppo_lstm.update(agent, optimizer, storage, cfg)
            storage.after_update()
    finally:
        state.envs.close()
    return T


def dqn_steps(device, watch, tmp_path, monkeypatch):
    """DQN's acting, storing, gradient step and target update, on real CartPole envs."""
    from rlstore.envs import make_vec_env

    cfg = DQNConfig(num_envs=N, batch_size=32, n_step=3, double_dqn=True, max_grad_norm=10.0)
    envs = make_vec_env("CartPole-v1", N, seed=1)
    q_network = QNetwork(4, 2).to(device)
    target_network = copy.deepcopy(q_network)
    optimizer = optimizer_for(q_network, device, monkeypatch)
    buffer = ReplayBuffer(100, N, (4,), device=device, n_step=3, seed=1)
    greedy = GreedyActor(q_network.advantage_path)
    obs, _ = envs.reset(seed=1)
    with watch:
        for _ in range(T):
            action = epsilon_greedy(greedy, obs, 0.5, 2)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            buffer.add(obs, action, reward, next_obs, terminated, truncated)
            obs = next_obs
        assert buffer.ready(32)
        gradient_step(q_network, target_network, optimizer, buffer, 0.4, cfg)
        update_target(target_network, q_network, 1.0)
    envs.close()
    return T


def pendulum_buffer(device: torch.device) -> ReplayBuffer:
    return ReplayBuffer(
        100,
        N,
        (3,),
        torch.float32,
        action_shape=(1,),
        action_dtype=torch.float32,
        device=device,
        seed=1,
    )


def act_and_store(agent, envs, buffer, device) -> None:
    """T vector steps of a continuous-action agent on `envs` (Pendulum), stored."""
    obs, _ = envs.reset(seed=1)
    for _ in range(T):
        action = agent.act(torch.as_tensor(obs, device=device))[0].cpu().numpy()
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        buffer.add(obs, action, reward, next_obs, terminated, truncated)
        obs = next_obs


def offpolicy_steps(algo, device, watch, tmp_path, monkeypatch):
    """SAC's, TD3's or DDPG's acting, storing, gradient steps (the actor's included) and
    target updates, on real Pendulum envs."""
    from rlstore.algos import ddpg, sac, td3
    from rlstore.continuous_networks import DeterministicActorCritic, SquashedGaussianActorCritic
    from rlstore.envs import make_vec_env

    envs = make_vec_env("Pendulum-v1", N, seed=1)
    space = envs.single_action_space
    network = SquashedGaussianActorCritic if algo == "sac" else DeterministicActorCritic
    critics = {"critics": 1} if algo == "ddpg" else {}
    agent = network(3, space.low, space.high, (16, 16), **critics).to(device)
    buffer = pendulum_buffer(device)
    with watch:
        act_and_store(agent, envs, buffer, device)
        assert buffer.ready(32)
        if algo == "sac":
            cfg, target = sac.SACConfig(batch_size=32), copy.deepcopy(agent.critic)
            entropy = sac.EntropyCoefficient().to(device)
            optimizers = sac.Optimizers(
                optimizer_for(agent.actor, device, monkeypatch),
                optimizer_for(agent.critic, device, monkeypatch),
                optimizer_for(entropy, device, monkeypatch),
            )
            for number in (1, 2):  # the second with the actor and the entropy steps
                sac.gradient_step(number, agent, target, entropy, optimizers, buffer, cfg, -1.0)
        else:
            config = ddpg.DDPGConfig if algo == "ddpg" else td3.TD3Config
            cfg, target = config(batch_size=32), copy.deepcopy(agent)
            actor_opt = optimizer_for(agent.actor, device, monkeypatch)
            critic_opt = optimizer_for(agent.critic, device, monkeypatch)
            for number in (1, 2):
                td3.gradient_step(number, agent, target, actor_opt, critic_opt, buffer, cfg)
    envs.close()
    return T


def replay_method_steps(algo, device, watch, tmp_path, monkeypatch):
    """C51's, QR-DQN's or Rainbow's (noisy, dueling, 3-step, prioritized) acting, storing
    and two gradient steps, on real CartPole envs; the priority updates made."""
    from rlstore.algos import c51, qrdqn, rainbow
    from rlstore.envs import make_vec_env

    module, config = {
        "c51": (c51, c51.C51Config),
        "qrdqn": (qrdqn, qrdqn.QRDQNConfig),
        "rainbow": (c51, rainbow.RainbowConfig),
    }[algo]
    cfg = config(num_envs=N, batch_size=32, q_hidden=(16, 16))
    envs = make_vec_env("CartPole-v1", N, seed=1)
    q_network = module.VARIANT.network(cfg, envs.single_observation_space, 2).to(device)
    target_network = copy.deepcopy(q_network)
    optimizer = optimizer_for(q_network, device, monkeypatch)
    buffer = ReplayBuffer(
        100, N, (4,), device=device, n_step=cfg.n_step, prioritized=cfg.prioritized, seed=1
    )
    obs, _ = envs.reset(seed=1)
    with watch:
        for _ in range(T):
            action = epsilon_greedy(q_network.greedy_action, obs, 0.5, 2)
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            buffer.add(obs, action, reward, next_obs, terminated, truncated)
            obs = next_obs
        for _ in range(2):
            gradient_step(
                q_network, target_network, optimizer, buffer, 0.4, cfg, loss_of=module.VARIANT.loss
            )
        update_target(target_network, q_network, 1.0)
    envs.close()
    return 2 if cfg.prioritized else 0


def pqn_iteration(device, watch, tmp_path, monkeypatch):
    """PQN's loop for one rollout: acting epsilon-greedily with max Q stored as the value,
    the Q(lambda) returns, then its epochs of minibatch steps."""
    from rlstore.algos.pqn import LayerNormQNetwork, PQNConfig, max_q, pqn_update
    from rlstore.encoders import encoder_for
    from rlstore.envs import make_vec_env

    cfg = PQNConfig(num_envs=N, num_steps=T, num_minibatches=2)
    envs = make_vec_env("CartPole-v1", N, seed=1)
    encoder = encoder_for(envs.single_observation_space)
    q_network = LayerNormQNetwork(2, (16, 16), encoder).to(device)
    optimizer = optimizer_for(q_network, device, monkeypatch)
    storage = RolloutStorage(T, N, (4,), device=device)
    obs, _ = envs.reset(seed=1)
    storage.reset(obs)
    no_log_prob = np.zeros(N, dtype=np.float32)
    with watch:
        for _ in range(T):
            value, greedy = max_q(q_network, storage.current_obs, None)
            greedy = greedy.cpu().numpy()  # the env boundary
            action = epsilon_greedy(lambda *_, greedy=greedy: greedy, obs, 0.5, 2)
            obs, reward, terminated, truncated, _ = envs.step(action)
            storage.insert(obs, action, no_log_prob, value, reward, terminated, truncated)
        next_value = max_q(q_network, storage.current_obs, None)[0]
        storage.compute_returns(next_value, cfg.gamma, cfg.q_lambda)
        pqn_update(q_network, optimizer, storage, cfg)
        storage.after_update()
    envs.close()
    return 0


def continuous_method_steps(algo, device, watch, tmp_path, monkeypatch):
    """TQC's (with and without its sorted loss) or CrossQ's acting, storing and three
    gradient steps (the actor's and the entropy coefficient's at the third), on real
    Pendulum envs."""
    from rlstore.algos import crossq, sac, tqc
    from rlstore.encoders import encoder_for
    from rlstore.envs import make_vec_env

    envs = make_vec_env("Pendulum-v1", N, seed=1)
    space = envs.single_action_space
    encoder = encoder_for(envs.single_observation_space)
    if algo == "crossq":
        cfg = crossq.CrossQConfig(batch_size=32, renorm_warmup_steps=1)  # both sides of it
        agent = crossq.CrossQActorCritic(space.low, space.high, (16,), (32,), encoder).to(device)
    else:
        fast = "auto" if algo == "tqc" else "off"
        cfg = tqc.TQCConfig(batch_size=32, policy_frequency=3, fast_paths=fast)
        agent = tqc.TQCActorCritic(space.low, space.high, (16, 16), encoder, 2, 5).to(device)
    entropy = sac.EntropyCoefficient().to(device)
    optimizers = {
        name: optimizer_for(part, device, monkeypatch)
        for name, part in (("actor", agent.actor), ("critic", agent.critic), ("alpha", entropy))
    }
    buffer = pendulum_buffer(device)
    target_critic = copy.deepcopy(agent.critic)
    with watch:
        act_and_store(agent, envs, buffer, device)
        for number in (1, 2, 3):
            if algo == "crossq":
                crossq.gradient_step(number, agent, entropy, optimizers, buffer, cfg, -1.0)
            else:
                tqc.gradient_step(
                    number, agent, target_critic, entropy, optimizers, buffer, cfg, -1.0
                )
    envs.close()
    return 0


# Issue 61's methods: (algo, device, watch, tmp_path, monkeypatch) -> the priority updates made
METHODS = {
    "c51": replay_method_steps,
    "qrdqn": replay_method_steps,
    "rainbow": replay_method_steps,
    "pqn": lambda algo, *args: pqn_iteration(*args),
    "tqc": continuous_method_steps,
    "tqc-reference-loss": continuous_method_steps,
    "crossq": continuous_method_steps,
}


def test_meta_tensors_refuse_host_reads():
    """The premise: on meta tensors a host read raises, so the tests below can fail."""
    with pytest.raises(RuntimeError):
        torch.zeros(1, device="meta").item()
    with pytest.raises(NotImplementedError):
        torch.zeros(3, device="meta").nonzero()
    with pytest.raises(TypeError):
        torch.zeros(3, device="meta").numpy()


@pytest.mark.parametrize("loop", [ppo_iteration, a2c_iteration, ppo_lstm_iteration, dqn_steps])
def test_loop_reads_the_device_only_at_the_env_boundary(loop, env_boundary, tmp_path, monkeypatch):
    steps = loop(torch.device("meta"), contextlib.nullcontext(), tmp_path, monkeypatch)
    assert 0 < len(env_boundary) <= steps  # the actions, once per vector step at most
    assert all(shape == (N,) for shape in env_boundary)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("loop", [ppo_iteration, a2c_iteration, ppo_lstm_iteration, dqn_steps])
def test_loop_never_synchronises_on_cuda_but_at_the_env_boundary(
    loop, env_boundary, tmp_path, monkeypatch
):
    @contextlib.contextmanager
    def sync_is_an_error():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    steps = loop(torch.device("cuda"), sync_is_an_error(), tmp_path, monkeypatch)
    assert 0 < len(env_boundary) <= steps


@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_offpolicy_loop_reads_the_device_only_at_the_env_boundary(
    algo, env_boundary, tmp_path, monkeypatch
):
    steps = offpolicy_steps(
        algo, torch.device("meta"), contextlib.nullcontext(), tmp_path, monkeypatch
    )
    assert 0 < len(env_boundary) <= steps
    assert all(shape == (N, 1) for shape in env_boundary)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algo", ["sac", "td3", "ddpg"])
def test_offpolicy_loop_never_synchronises_on_cuda_but_at_the_env_boundary(
    algo, env_boundary, tmp_path, monkeypatch
):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        steps = offpolicy_steps(
            algo, torch.device("cuda"), contextlib.nullcontext(), tmp_path, monkeypatch
        )
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert 0 < len(env_boundary) <= steps


def method_reads(algo, device, env_boundary, tmp_path, monkeypatch):
    """Run METHODS[algo] and check its device reads: the env boundary's actions, once per
    vector step at most, and with prioritized replay the TD errors of each priority update
    (the batch of 32)."""
    updates = METHODS[algo](algo, device, contextlib.nullcontext(), tmp_path, monkeypatch)
    td_errors = [shape for shape in env_boundary if shape == (32,)]
    actions = [shape for shape in env_boundary if shape != (32,)]
    assert 0 < len(actions) <= T and len(set(actions)) == 1, env_boundary
    assert len(td_errors) == updates, env_boundary


@pytest.mark.parametrize("algo", list(METHODS))
def test_distributional_pqn_tqc_and_crossq_read_the_device_only_at_the_env_boundary(
    algo, env_boundary, tmp_path, monkeypatch
):
    method_reads(algo, torch.device("meta"), env_boundary, tmp_path, monkeypatch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("algo", list(METHODS))
def test_distributional_pqn_tqc_and_crossq_never_synchronise_on_cuda_but_at_those_reads(
    algo, env_boundary, tmp_path, monkeypatch
):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        method_reads(algo, torch.device("cuda"), env_boundary, tmp_path, monkeypatch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
