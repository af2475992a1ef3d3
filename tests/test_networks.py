"""ActorCritic: the direct formulas agree with torch.distributions; init and shapes.
GreedyActor: its numpy forward picks the actions of the torch Q-network."""

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal

from rlstore.networks import ActorCritic, GreedyActor, QNetwork, actor_critic_for


def test_categorical_head_matches_torch_distributions():
    torch.manual_seed(0)
    net = ActorCritic(obs_dim=4, action_dim=3)
    obs = torch.randn(64, 4)
    action, log_prob, value = net.act(obs)
    assert action.shape == (64,) and action.dtype == torch.int64
    dist = Categorical(logits=net.actor(obs))
    torch.testing.assert_close(log_prob, dist.log_prob(action))
    torch.testing.assert_close(value, net.critic(obs).squeeze(-1))
    new_log_prob, entropy, _ = net.evaluate(obs, action)
    torch.testing.assert_close(new_log_prob, dist.log_prob(action))
    torch.testing.assert_close(entropy, dist.entropy())


def test_categorical_sampling_follows_the_probabilities():
    torch.manual_seed(0)
    net = ActorCritic(obs_dim=1, action_dim=3)
    with torch.no_grad():
        net.actor[-1].weight.zero_()
        net.actor[-1].bias.copy_(torch.log(torch.tensor([0.2, 0.3, 0.5])))
    actions, _, _ = net.act(torch.zeros(20_000, 1))
    freq = torch.bincount(actions, minlength=3).float() / 20_000
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.3, 0.5]), atol=0.015, rtol=0)


def test_gaussian_head_matches_torch_distributions_and_is_unclipped():
    torch.manual_seed(0)
    net = ActorCritic(obs_dim=3, action_dim=2, continuous=True)
    with torch.no_grad():
        net.actor_logstd.fill_(math.log(5.0))  # wide enough that samples leave [-1, 1]
    obs = torch.randn(256, 3)
    action, log_prob, _ = net.act(obs)
    assert action.shape == (256, 2)
    assert action.abs().max() > 1.0  # stored raw; only what goes to the env is clipped
    dist = Normal(net.actor(obs), net.actor_logstd.exp())
    torch.testing.assert_close(log_prob, dist.log_prob(action).sum(-1))
    new_log_prob, entropy, _ = net.evaluate(obs, action)
    torch.testing.assert_close(new_log_prob, dist.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))


def test_orthogonal_init_gains():
    net = ActorCritic(obs_dim=8, action_dim=4)
    last_actor, last_critic = net.actor[-1].weight, net.critic[-1].weight
    # An orthogonal matrix with gain g has rows of norm g (for fewer rows than columns).
    torch.testing.assert_close(last_actor.norm(dim=1), torch.full((4,), 0.01))
    torch.testing.assert_close(last_critic.norm(dim=1), torch.full((1,), 1.0))
    assert torch.all(net.actor[0].bias == 0)


def test_built_from_spaces():
    box = spaces.Box(-1, 1, (6,))
    assert not actor_critic_for(box, spaces.Discrete(5)).continuous
    assert actor_critic_for(box, spaces.Box(-2, 2, (3,))).continuous
    with pytest.raises(ValueError, match="unsupported action space"):
        actor_critic_for(box, spaces.MultiDiscrete([2, 3]))


def torch_greedy(q_network: QNetwork, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The oracle: argmax of the module's forward, and which rows have no near-tie."""
    with torch.no_grad():
        q = q_network(torch.from_numpy(obs)).numpy()
    top2 = np.sort(q, axis=-1)[:, -2:]
    return q.argmax(-1), top2[:, 1] - top2[:, 0] > 1e-4


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("use_numpy", [True, False])
def test_greedy_actor_picks_the_q_networks_argmax(dueling, use_numpy):
    torch.manual_seed(0)
    q_network = QNetwork(6, 5, dueling=dueling)
    actor = GreedyActor(q_network, use_numpy=use_numpy)
    rng = np.random.default_rng(0)
    for rows in (1, 4, 256):
        obs = rng.normal(size=(rows, 6)).astype(np.float32) * 3
        expected, clear = torch_greedy(q_network, obs)
        actions = actor(obs)
        assert actions.dtype == np.int64 and actions.shape == (rows,)
        np.testing.assert_array_equal(actions[clear], expected[clear])
        assert clear.mean() > 0.9


def test_greedy_actor_follows_parameter_updates_and_moves():
    """Views of the live parameters: an optimizer step, a state load and a dtype move
    (which replaces the parameters) are all seen by the next call."""
    torch.manual_seed(1)
    q_network, other = QNetwork(4, 3), QNetwork(4, 3)
    actor = GreedyActor(q_network)
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
    actions = GreedyActor(q_network.to("cuda"))(obs)  # the torch path, on the GPU
    np.testing.assert_array_equal(actions[clear], expected[clear])
