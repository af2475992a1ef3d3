"""Action heads (rlstore/action_heads.py) against torch.distributions: MultiDiscrete as
independent Categoricals and MultiBinary as independent Bernoullis, log-probs and
entropies summed; samples that follow the distribution; the env's shapes and starts."""

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Bernoulli, Categorical

from rlstore.action_heads import BernoulliHead, MultiCategoricalHead, head_for, head_from_spec
from rlstore.host_updates import HostPPOStep
from rlstore.networks import ActorCritic, policy_spec


def test_multi_categorical_log_probs_and_entropies_are_the_summed_categoricals():
    torch.manual_seed(0)
    head = MultiCategoricalHead([3, 1, 5])
    logits = torch.randn(64, 9) * 2
    actions = torch.stack([torch.randint(0, n, (64,)) for n in (3, 1, 5)], -1)
    parts = [Categorical(logits=p) for p in logits.split([3, 1, 5], -1)]
    expected_lp = sum(d.log_prob(actions[:, i]) for i, d in enumerate(parts))
    expected_h = sum(d.entropy() for d in parts)
    log_prob, entropy = head.log_prob_and_entropy(logits, actions)
    torch.testing.assert_close(log_prob, expected_lp)
    torch.testing.assert_close(entropy, expected_h)
    np.testing.assert_array_equal(
        head.mode(logits), torch.stack([p.argmax(-1) for p in logits.split([3, 1, 5], -1)], -1)
    )


def test_multi_categorical_samples_follow_each_categorical():
    torch.manual_seed(1)
    head = MultiCategoricalHead([3, 2])
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, 1.0]]).repeat(40_000, 1)
    actions, log_prob = head.sample(logits)
    torch.testing.assert_close(log_prob, head.log_prob_and_entropy(logits, actions)[0])
    for i, part in enumerate(logits[0].split([3, 2])):
        freq = torch.bincount(actions[:, i], minlength=len(part)).float() / len(actions)
        torch.testing.assert_close(freq, part.softmax(-1), atol=0.01, rtol=0)


def test_bernoulli_log_probs_entropies_and_samples_are_the_bernoullis():
    torch.manual_seed(2)
    head = BernoulliHead([2, 3])
    logits = torch.randn(32, 6) * 3
    bits = torch.randint(0, 2, (32, 6))
    d = Bernoulli(logits=logits)
    log_prob, entropy = head.log_prob_and_entropy(logits, bits)
    torch.testing.assert_close(log_prob, d.log_prob(bits.float()).sum(-1))
    torch.testing.assert_close(entropy, d.entropy().sum(-1))
    many = torch.tensor([[-1.0, 0.0, 2.0, 0.5, -3.0, 1.0]]).repeat(40_000, 1)
    sampled, lp = head.sample(many)
    torch.testing.assert_close(sampled.float().mean(0), torch.sigmoid(many[0]), atol=0.01, rtol=0)
    torch.testing.assert_close(lp, head.log_prob_and_entropy(many, sampled)[0])
    assert head.env_action(sampled[:2].numpy()).shape == (2, 2, 3)


def test_heads_of_the_spaces_shift_and_shape_the_env_actions():
    head = head_for(spaces.MultiDiscrete([[3, 2], [4, 5]], start=[[1, 0], [-2, 0]]))
    stored = np.array([[2, 1, 0, 4]])
    np.testing.assert_array_equal(head.env_action(stored), [[[3, 1], [-2, 4]]])
    assert head_for(spaces.Discrete(3)) is None and head_for(spaces.Box(-1, 1, (2,))) is None


@pytest.mark.parametrize(
    "space", [spaces.MultiDiscrete([3, 4], start=[1, 0]), spaces.MultiBinary(4)]
)
def test_an_actor_critic_with_a_head_is_rebuilt_from_its_spec(space):
    torch.manual_seed(3)
    agent = ActorCritic(5, 0, head=head_for(space))
    spec = policy_spec(agent, spaces.Box(-1, 1, (5,)), space)
    rebuilt = ActorCritic.from_spec(spec)
    rebuilt.load_state_dict(agent.state_dict())
    obs = torch.randn(6, 5)
    torch.testing.assert_close(rebuilt.deterministic_action(obs), agent.deterministic_action(obs))
    action, log_prob, _ = agent.act(obs)
    torch.testing.assert_close(agent.evaluate(obs, action)[0], log_prob)
    assert head_from_spec(spec["action_head"]).spec() == agent.head.spec()


@pytest.mark.parametrize(
    "space, masked",
    [
        (spaces.MultiDiscrete([3, 4], start=[1, 0]), False),
        (spaces.MultiDiscrete([3, 4]), True),
        (spaces.MultiBinary(4), False),
    ],
)
def test_an_actor_critic_with_a_head_acts_in_numpy_as_in_torch(space, masked):
    """act_on_host with a head: for the actions it samples, the torch policy's log-probs
    (under the same masks) and values to float32 rounding; each entry's values as often as
    its mean probability says, a masked value never; the same actions from the same seed."""
    torch.manual_seed(3)
    head = head_for(space)
    agent = ActorCritic(5, 0, head=head)
    adam = torch.optim.Adam(agent.parameters())
    assert not HostPPOStep.supports(agent, adam)  # (its gradients: a categorical's, a Gaussian's)
    with torch.no_grad():  # logits far from 0: probabilities far from uniform
        agent.actor[-1].weight.mul_(300)
        agent.actor[-1].bias.copy_(torch.linspace(-2, 2, head.out_dim))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(6000, 5)).astype(np.float32)
    masks = None
    if masked:  # each entry keeps an allowed value
        masks = rng.random((6000, 7)) < 0.5
        masks[np.arange(6000), rng.integers(0, 3, 6000)] = True
        masks[np.arange(6000), 3 + rng.integers(0, 4, 6000)] = True
    np.random.seed(5)
    action, log_prob, value = agent.act_on_host(obs, masks)
    assert action.dtype == np.int64 and action.shape == (6000, *head.stored_shape)
    assert log_prob.dtype == value.dtype == np.float32
    as_torch = None if masks is None else torch.from_numpy(masks)
    with torch.no_grad():
        expected_lp, _, expected_v = agent.evaluate(
            torch.from_numpy(obs), torch.from_numpy(action), as_torch
        )
        logits = agent.actor_path(torch.from_numpy(obs))
        if masks is not None:
            logits = logits.masked_fill(~as_torch, -1e8)
    torch.testing.assert_close(torch.from_numpy(log_prob), expected_lp, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.from_numpy(value), expected_v, rtol=1e-5, atol=1e-5)
    np.random.seed(5)
    np.testing.assert_array_equal(agent.act_on_host(obs, masks)[0], action)
    if isinstance(head, BernoulliHead):
        probs = torch.sigmoid(logits).mean(0).numpy()
        assert probs.min() < 0.4 and probs.max() > 0.6  # (not all near one half)
        np.testing.assert_allclose(action.mean(0), probs, atol=0.02)
        return
    # the entries independent given the observation: the pairs as often as the mean of
    # the products of their probabilities
    first, second = (part.softmax(-1) for part in logits.split(head.nvec, -1))
    joint = (first[:, :, None] * second[:, None, :]).mean(0).numpy()
    pairs = np.zeros_like(joint)
    np.add.at(pairs, (action[:, 0], action[:, 1]), 1 / len(action))
    np.testing.assert_allclose(pairs, joint, atol=0.02)
    offset = 0
    for i, n in enumerate(head.nvec):
        probs = logits[:, offset : offset + n].softmax(-1).mean(0).numpy()
        freq = np.bincount(action[:, i], minlength=n) / len(action)
        np.testing.assert_allclose(freq, probs, atol=0.02)
        if masks is not None:
            assert masks[np.arange(6000), offset + action[:, i]].all()
        offset += n
