"""ActorCritic: the direct formulas agree with torch.distributions; init and shapes.
the policy spec that rebuilds them."""

import math

import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal

from rlstore.networks import ActorCritic, actor_critic_for


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
    assert actor_critic_for(box, spaces.MultiDiscrete([2, 3])).head.nvec == [2, 3]
    with pytest.raises(ValueError, match="unsupported action space"):
        actor_critic_for(box, spaces.Box(-1, 1, (2, 2)))


def test_deterministic_actor_critic_spec_keeps_its_critic_count():
    """TD3's two critics and DDPG's one survive the spec; a spec from before DDPG, without
    the count, held TD3's two."""
    from rlstore.continuous_networks import DeterministicActorCritic
    from rlstore.networks import policy_spec

    obs_space, action_space = spaces.Box(-1, 1, (3,)), spaces.Box(-2, 2, (1,))
    for critics in (1, 2):
        net = DeterministicActorCritic(3, [-2.0], [2.0], (8,), critics=critics)
        spec = policy_spec(net, obs_space, action_space)
        rebuilt = DeterministicActorCritic.from_spec(spec)
        assert rebuilt.critic.count == critics
        rebuilt.load_state_dict(net.state_dict())  # the same parameters, no more, no fewer
        assert rebuilt.q_values(torch.zeros(5, 3), torch.zeros(5, 1)).shape == (5, critics)
        spec.pop("critics")
        assert DeterministicActorCritic.from_spec(spec).critic.count == 2
    with pytest.raises(ValueError, match="one or two critics"):
        DeterministicActorCritic(3, [-2.0], [2.0], (8,), critics=3)
