"""The GPU path makes no host/device synchronisation in the loop beyond the env boundary.

CI has no GPU, so the same code runs with its tensors on PyTorch's "meta" device: meta
tensors have no data, and anything that reads device data on the host (`.item()`,
`bool(t)`, `.cpu()`, `nonzero`, boolean-mask indexing) raises. A storage or update step
that passes here does not wait for a GPU either. With a GPU present, the same steps also
run on CUDA under torch's sync debug mode.
"""

import contextlib

import numpy as np
import pytest
import torch

from rlstore import ActorCritic, PPOConfig, QNetwork, ReplayBuffer, RolloutStorage
from rlstore.algos.dqn import td_loss
from rlstore.algos.ppo import ppo_loss
from rlstore.config import DQNConfig
from rlstore.storage.rollout import to_device

N, T = 4, 16


def env_outputs(rng):
    """One vector step's host-side env outputs: next_obs, reward, terminated, truncated."""
    kind = rng.random(N)
    return (
        rng.normal(size=(N, 4)).astype(np.float32),
        rng.normal(size=N),
        kind < 0.1,
        (kind >= 0.1) & (kind < 0.2),
    )


def ppo_rollout_and_update(device, watch):
    """Build (copying the network to the device may block), then run the loop under `watch`."""
    rng = np.random.default_rng(0)
    agent = ActorCritic(4, 2).to(device)
    storage = RolloutStorage(T, N, (4,), device=device)
    with watch:
        ppo_loop(agent, storage, rng)


def ppo_loop(agent, storage, rng):
    storage.reset(rng.normal(size=(N, 4)).astype(np.float32))
    for _ in range(T):
        with torch.inference_mode():
            action, log_prob, value = agent.act(storage.current_obs)
        # (here the loop hands action.cpu() to the env: the env boundary)
        next_obs, reward, terminated, truncated = env_outputs(rng)
        storage.insert(next_obs, action, log_prob, value, reward, terminated, truncated)
    with torch.inference_mode():
        next_value = agent.value(storage.current_obs)
    storage.compute_returns(next_value, gamma=0.99, gae_lambda=0.95)
    for batch in storage.minibatches(4):
        new_log_prob, entropy, new_value = agent.evaluate(batch.obs, batch.actions)
        ppo_loss(new_log_prob, new_value, entropy, batch, PPOConfig())["loss"].backward()
    storage.after_update()


def dqn_steps_and_update(device, watch):
    rng = np.random.default_rng(1)
    q_network, target_network = QNetwork(4, 2).to(device), QNetwork(4, 2).to(device)
    buffer = ReplayBuffer(100, N, (4,), device=device, n_step=3, seed=1)
    with watch:
        dqn_loop(q_network, target_network, buffer, rng, device)


def dqn_loop(q_network, target_network, buffer, rng, device):
    obs = rng.normal(size=(N, 4)).astype(np.float32)
    for _ in range(T):
        with torch.inference_mode():  # (.cpu() of the argmax is the env boundary)
            q_network(to_device(torch.from_numpy(obs), device)).argmax(-1)
        next_obs, reward, terminated, truncated = env_outputs(rng)
        buffer.add(obs, rng.integers(0, 2, N), reward, next_obs, terminated, truncated)
        obs = next_obs
    assert buffer.ready(32)
    loss, _, _ = td_loss(q_network, target_network, buffer.sample(32), DQNConfig())
    loss.backward()


def test_meta_tensors_refuse_host_reads():
    """The premise: on meta tensors a host read raises, so the tests below can fail."""
    with pytest.raises(RuntimeError):
        torch.zeros(1, device="meta").item()
    with pytest.raises(NotImplementedError):
        torch.zeros(3, device="meta").nonzero()


@pytest.mark.parametrize("steps", [ppo_rollout_and_update, dqn_steps_and_update])
def test_loop_steps_never_read_the_device(steps):
    steps(torch.device("meta"), contextlib.nullcontext())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("steps", [ppo_rollout_and_update, dqn_steps_and_update])
def test_loop_steps_never_synchronise_on_cuda(steps):
    @contextlib.contextmanager
    def sync_is_an_error():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    steps(torch.device("cuda"), sync_is_an_error())
