"""Observation encoders (rlstore/encoders.py): each against a naive reference written from its
definition, their numpy twins against them, the networks rebuilt from model.pt's spec, and
the numpy fast paths on encoded observations against the torch paths."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rlstore.continuous_networks import DeterministicActorCritic, SquashedGaussianActorCritic
from rlstore.encoders import (
    SMALL_CNN_CHANNELS,
    CombinedEncoder,
    FlatEncoder,
    ImageEncoder,
    ImageOptions,
    UnsupportedSpace,
    describe_space,
    described_shape,
    encoder_for,
    encoder_from_description,
    image_layout,
    stored_dtype,
    stored_shape,
)
from rlstore.networks import ActorCritic, QNetwork, policy_spec
from rlstore.parts import as_tensors
from rlstore.recurrent_networks import RecurrentActorCritic


def naive_one_hots(obs: np.ndarray, nvec: list[int], start: list[int]) -> np.ndarray:
    """Row by row, entry by entry: a block of n zeros per entry with a 1 at value - start."""
    rows = []
    for row in obs.reshape(len(obs), -1):
        blocks = []
        for value, n, s in zip(row, nvec, start, strict=True):
            block = [0.0] * n
            block[int(value) - s] = 1.0
            blocks += block
        rows.append(blocks)
    return np.asarray(rows, dtype=np.float32)


@settings(max_examples=40, deadline=None)
@given(
    nvec=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    starts=st.lists(st.integers(-3, 3), min_size=5, max_size=5),
    batch=st.integers(1, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_multi_discrete_one_hots_are_the_naive_ones(nvec, starts, batch, seed):
    start = starts[: len(nvec)]
    space = spaces.MultiDiscrete(nvec, start=start, seed=seed)
    obs = np.stack([space.sample() for _ in range(batch)])
    encoder = encoder_for(space)
    expected = naive_one_hots(obs, nvec, start)
    assert encoder.out_dim == sum(nvec)
    np.testing.assert_array_equal(encoder(torch.from_numpy(obs)).numpy(), expected)
    np.testing.assert_array_equal(encoder.host(obs), expected)


@pytest.mark.parametrize("n, start", [(16, 0), (5, -2), (1, 7)])
def test_discrete_observations_are_one_hots(n, start):
    space = spaces.Discrete(n, start=start)
    obs = np.arange(start, start + n)  # every value once: the identity matrix
    encoder = encoder_for(space)
    np.testing.assert_array_equal(encoder(torch.from_numpy(obs)).numpy(), np.eye(n))
    np.testing.assert_array_equal(encoder.host(obs), np.eye(n, dtype=np.float32))
    assert encoder(torch.from_numpy(obs)).dtype == torch.float32


def test_multi_discrete_of_two_dimensions_is_flattened_in_order():
    space = spaces.MultiDiscrete([[2, 3], [4, 2]])
    obs = np.array([[[1, 2], [3, 0]]])
    expected = naive_one_hots(obs, [2, 3, 4, 2], [0, 0, 0, 0])
    np.testing.assert_array_equal(encoder_for(space)(torch.from_numpy(obs)).numpy(), expected)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1, 1, (3, 4, 2)),
        spaces.MultiBinary(5),
        spaces.MultiBinary([2, 3]),
        spaces.Box(0, 255, (8, 8), np.uint8),
    ],
)
def test_vectors_and_binary_are_flattened_floats(space):
    obs = np.stack([space.sample() for _ in range(4)])
    encoder = encoder_for(space)
    assert isinstance(encoder, FlatEncoder)
    expected = obs.reshape(4, -1).astype(np.float32)
    np.testing.assert_array_equal(encoder(torch.from_numpy(obs)).numpy(), expected)
    np.testing.assert_array_equal(encoder.host(obs), expected)


@pytest.mark.parametrize("shape", [(7, 7, 3), (64, 64, 3), (3, 7, 7), (3, 48, 40)])
def test_images_take_the_cnn_for_their_size_in_either_layout(shape):
    """Channels last is channels first transposed: the same CNN (same parameters) gives the
    same features; the small CNN below 36 pixels a side, the Nature CNN from there; inside
    (uint8 all the way in), the Nature CNN's pixels are divided by 255, the small CNN's
    grids of symbols not, unless an image scale is given."""
    first = shape if image_layout(shape) == "channels_first" else (shape[2], *shape[:2])
    last = (*first[1:], first[0])
    torch.manual_seed(0)
    enc_first = ImageEncoder(first)
    enc_last = ImageEncoder(last)
    enc_last.load_state_dict(enc_first.state_dict())
    images = torch.randint(0, 256, (5, *first), dtype=torch.uint8)
    out = enc_first(images)
    torch.testing.assert_close(enc_last(images.permute(0, 2, 3, 1)), out)
    assert out.shape == (5, enc_first.out_dim)
    convs = [m for m in enc_first.cnn if isinstance(m, nn.Conv2d)]
    assert convs[0].kernel_size == ((8, 8) if min(first[1:]) >= 36 else (2, 2))
    # the scaling: the first convolution sees pixels / 255, or grids as they are
    auto_scale = 255.0 if min(first[1:]) >= 36 else 1.0
    for options, scale in ((ImageOptions(), auto_scale), (ImageOptions(scale=4.0), 4.0)):
        torch.manual_seed(0)
        encoder = ImageEncoder(first, options)
        assert encoder.scale == scale == encoder_for(space_of(first), options).scale
        convs = [m for m in encoder.cnn if isinstance(m, nn.Conv2d)]
        with torch.no_grad():
            expected = convs[0](images.float() / scale)
            seen = encoder.cnn[1](encoder.cnn[0](images))
        torch.testing.assert_close(seen, expected, rtol=1e-5, atol=1e-5)


def space_of(image_shape):
    return spaces.Box(0, 255, image_shape, np.uint8)


def test_model_files_from_before_the_image_scale_keep_dividing_by_255():
    """Descriptions written before "scale" (and "channels") rebuild the encoder they
    were trained with: the small CNN divided its grids by 255 then."""
    old = {"type": "image", "shape": [7, 7, 3], "dtype": "uint8"}
    encoder = encoder_from_description(old)
    assert encoder.scale == 255.0
    convs = [m for m in encoder.cnn if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == list(SMALL_CNN_CHANNELS)
    assert describe_space(space_of((7, 7, 3)))["scale"] == 1.0


def test_minigrid_sized_images_give_the_small_cnns_features():
    encoder = ImageEncoder((7, 7, 3))
    assert encoder.channels_last and encoder.out_dim == 64 * 4 * 4


PAIR = spaces.Tuple((spaces.MultiBinary(2), spaces.Box(-1, 1, (2,))))
DICT = spaces.Dict(
    {
        "image": spaces.Box(0, 255, (7, 7, 3), np.uint8),
        "direction": spaces.Discrete(4),
        "pair": PAIR,
    }
)
TUPLE = spaces.Tuple((spaces.Discrete(32), spaces.Discrete(11), spaces.Discrete(2)))  # Blackjack


def batch_of(space, n):
    """n observations of `space` as a vector env batches them, as tensors."""
    return as_tensors(batch_space(space, n).sample())


@pytest.mark.parametrize(
    "space",
    [
        spaces.Discrete(4, start=1),
        spaces.MultiDiscrete([3, 2], start=[1, 0]),
        spaces.MultiBinary(3),
        spaces.Box(-1, 1, (2, 3)),
        spaces.Box(0, 255, (7, 7, 3), np.uint8),
        DICT,
        TUPLE,
    ],
)
def test_descriptions_rebuild_the_same_encoder(space):
    description = describe_space(space)
    import json

    assert json.loads(json.dumps(description)) == description  # what model.pt can keep
    torch.manual_seed(1)
    a = encoder_for(space)
    b = encoder_from_description(description)
    b.load_state_dict(a.state_dict())
    obs = batch_of(space, 3)
    torch.testing.assert_close(a(obs), b(obs))
    assert described_shape(description) == stored_shape(space)


def test_dict_and_tuple_encoders_concatenate_their_parts_encoders():
    """The features of a Dict (nested Tuple inside) are its parts' encoders' features,
    concatenated in the space's order, each part's encoder the one its space alone gets."""
    torch.manual_seed(0)
    encoder = encoder_for(DICT)
    assert isinstance(encoder, CombinedEncoder) and not hasattr(encoder, "host")  # (a CNN)
    obs = batch_of(DICT, 5)
    alone = [
        encoder.parts["direction"](obs["direction"]),
        encoder.parts["image"](obs["image"]),
        encoder.parts["pair"](obs["pair"]),
    ]
    torch.testing.assert_close(encoder(obs), torch.cat(alone, dim=1))
    direction = nn.functional.one_hot(obs["direction"], 4).float()
    torch.testing.assert_close(alone[0], direction)
    pair = torch.cat([obs["pair"][0].float(), obs["pair"][1]], dim=1)
    torch.testing.assert_close(alone[2], pair)
    assert encoder.out_dim == 4 + 64 * 4 * 4 + 4
    # parameter-free parts: a numpy twin, equal to the torch encoder
    blackjack = encoder_for(TUPLE)
    obs = batch_space(TUPLE, 6).sample()
    expected = np.concatenate([np.eye(n)[x] for n, x in zip((32, 11, 2), obs)], axis=1)
    np.testing.assert_array_equal(blackjack.host(obs), expected)
    np.testing.assert_array_equal(blackjack(as_tensors(obs)).numpy(), expected)
    assert stored_dtype(DICT) == {
        "direction": np.int64,
        "image": np.uint8,
        "pair": (np.int8, np.float32),
    }


@pytest.mark.parametrize(
    "space, part",
    [
        (spaces.Text(5), ""),
        (spaces.Dict({"a": spaces.Discrete(2), "m": spaces.Text(4)}), "['m']"),
        (spaces.Tuple([spaces.Discrete(2), spaces.Sequence(spaces.Discrete(2))]), "[1]"),
        (
            spaces.Dict({"x": spaces.Tuple([spaces.Graph(spaces.Box(0, 1, (2,)), None)])}),
            "['x'][0]",
        ),
    ],
)
def test_spaces_without_an_encoder_are_named(space, part):
    with pytest.raises(UnsupportedSpace, match="cannot encode") as error:
        describe_space(space)
    assert error.value.part == part
    assert (f"part {part} is" if part else "the observation space is") in str(error.value)


def test_stored_dtypes():
    assert stored_dtype(spaces.Box(-1, 1, (3,), np.float64)) == np.float32
    assert stored_dtype(spaces.Box(0, 255, (7, 7, 3), np.uint8)) == np.uint8
    assert stored_dtype(spaces.Discrete(3)) == np.int64
    assert stored_dtype(spaces.MultiBinary(3)) == np.int8


def build(network_class, space):
    encoder = encoder_for(space)
    if network_class is ActorCritic:
        return ActorCritic(0, 3, hidden=(8,), encoder=encoder), spaces.Discrete(3)
    if network_class is QNetwork:
        return QNetwork(0, 3, (8,), encoder=encoder), spaces.Discrete(3)
    if network_class is RecurrentActorCritic:
        return RecurrentActorCritic(0, 3, False, 8, (8,), encoder), spaces.Discrete(3)
    box = spaces.Box(-2, 2, (2,))
    if network_class is SquashedGaussianActorCritic:
        return SquashedGaussianActorCritic(0, box.low, box.high, (8,), encoder), box
    return DeterministicActorCritic(0, box.low, box.high, (8,), 0.1, 2, encoder), box


@pytest.mark.parametrize(
    "network_class",
    [
        ActorCritic,
        QNetwork,
        RecurrentActorCritic,
        SquashedGaussianActorCritic,
        DeterministicActorCritic,
    ],
)
@pytest.mark.parametrize(
    "space",
    [
        spaces.Discrete(6),
        spaces.MultiDiscrete([2, 3]),
        spaces.Box(-1, 1, (2, 2)),
        TUPLE,
        spaces.Dict({"a": spaces.Discrete(3), "b": spaces.Tuple((spaces.Box(-1, 1, (2,)),))}),
    ],
)
def test_networks_rebuilt_from_their_spec_act_the_same(network_class, space):
    network, action_space = build(network_class, space)
    spec = policy_spec(network, space, action_space)
    rebuilt = type(network).from_spec(spec)
    rebuilt.load_state_dict(network.state_dict())
    obs = batch_of(space, 4)
    if network_class is RecurrentActorCritic:
        state = network.initial_state(4)
        expected, _ = network.deterministic_action(obs, state)
        torch.testing.assert_close(rebuilt.deterministic_action(obs, state)[0], expected)
    elif network_class is QNetwork:
        torch.testing.assert_close(rebuilt.q_values(obs), network.q_values(obs))
    else:
        torch.testing.assert_close(
            rebuilt.deterministic_action(obs), network.deterministic_action(obs)
        )


def test_older_model_specs_without_an_observation_rebuild_flat_vectors():
    network = ActorCritic(4, 2)
    spec = policy_spec(network, spaces.Box(-1, 1, (4,)), spaces.Discrete(2))
    del spec["observation"], spec["hidden"]
    rebuilt = ActorCritic.from_spec(spec)
    assert isinstance(rebuilt.encoder, FlatEncoder) and rebuilt.hidden == (64, 64)


# -- the numpy fast paths on encoded observations ----------------------------------------------


def test_host_actor_critic_on_one_hots_acts_as_the_torch_policy():
    torch.manual_seed(3)
    space = spaces.MultiDiscrete([4, 3])
    agent = ActorCritic(0, 3, encoder=encoder_for(space))
    obs = np.stack([space.sample() for _ in range(500)])
    np.random.seed(5)
    action, log_prob, value = agent.act_on_host(obs)
    with torch.no_grad():
        lp, _, v = agent.evaluate(torch.from_numpy(obs), torch.from_numpy(action))
    torch.testing.assert_close(torch.from_numpy(log_prob), lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.from_numpy(value), v, rtol=1e-5, atol=1e-5)


def test_images_have_no_numpy_twin():
    agent = ActorCritic(0, 3, encoder=ImageEncoder((7, 7, 3)))
    assert agent.act_on_host is None


def test_host_ppo_step_on_one_hots_is_the_torch_step():
    from test_fast import reference_ppo_step

    from rlstore.algos.ppo import PPOConfig
    from rlstore.host_updates import HostPPOStep
    from rlstore.storage.rollout import RolloutBatch

    cfg = PPOConfig()
    torch.manual_seed(4)
    space = spaces.Discrete(7)
    agent = ActorCritic(0, 3, encoder=encoder_for(space))
    twin = copy.deepcopy(agent)
    opt = torch.optim.Adam(agent.parameters(), lr=3e-3, eps=1e-5, fused=True)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=3e-3, eps=1e-5, fused=True)
    fast = HostPPOStep(twin, twin_opt)
    rng = np.random.default_rng(5)
    B = 32
    f32 = lambda: torch.from_numpy(rng.normal(size=B).astype(np.float32))  # noqa: E731
    for _ in range(2):
        batch = RolloutBatch(
            obs=torch.from_numpy(rng.integers(0, 7, B)),
            actions=torch.from_numpy(rng.integers(0, 3, B)),
            log_probs=f32() - 1,
            values=f32(),
            advantages=f32(),
            returns=f32(),
        )
        expected = reference_ppo_step(agent, opt, batch, cfg)
        got = fast(batch, cfg)
        torch.testing.assert_close(got["loss"], expected["loss"].detach(), rtol=1e-4, atol=1e-5)
        for p, q in zip(agent.parameters(), twin.parameters(), strict=True):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_host_dqn_step_and_greedy_actor_on_one_hots_are_the_torch_ones():
    from rlstore.algos.dqn import DQNConfig, td_loss
    from rlstore.host_networks import GreedyActor
    from rlstore.host_updates import HostDQNStep
    from rlstore.storage.replay import ReplayBatch

    cfg = DQNConfig()
    torch.manual_seed(6)
    space = spaces.MultiDiscrete([3, 4])
    q, target = (QNetwork(0, 3, (16,), encoder=encoder_for(space)) for _ in range(2))
    twin, twin_target = copy.deepcopy(q), copy.deepcopy(target)
    opt = torch.optim.Adam(q.parameters(), lr=1e-2, fused=True)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-2, fused=True)
    assert HostDQNStep.supports(twin, twin_opt)
    assert not HostDQNStep.supports(QNetwork(0, 3, encoder=ImageEncoder((7, 7, 3))), twin_opt)
    fast = HostDQNStep(twin, twin_target, twin_opt)
    rng = np.random.default_rng(7)
    B = 64
    obs = lambda: torch.from_numpy(np.stack([space.sample() for _ in range(B)]))  # noqa: E731
    batch = ReplayBatch(
        obs=obs(),
        actions=torch.from_numpy(rng.integers(0, 3, B)),
        rewards=torch.from_numpy(rng.normal(size=B).astype(np.float32)),
        next_obs=obs(),
        terminated=torch.from_numpy(rng.random(B) < 0.2),
        discounts=torch.full((B,), 0.99),
        weights=torch.ones(B),
        indices=torch.arange(B),
    )
    expected = td_loss(q, target, batch, cfg)
    opt.zero_grad()
    expected[0].backward()
    opt.step()
    got = fast(
        batch._replace(**{k: v.numpy() for k, v in batch._asdict().items() if v is not None}), cfg
    )
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-5)
    greedy = GreedyActor(q.advantage_path, encoder=q.encoder)
    np.testing.assert_array_equal(greedy(batch.obs.numpy()), q.greedy_action(batch.obs.numpy()))


def test_lean_env_and_storage_keep_integer_observations():
    """FrozenLake's observations reach the storage as int64 states, not floats."""
    from rlstore.envs import make_vec_env

    envs = make_vec_env("FrozenLake-v1", 2, seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.dtype == np.int64 and obs.shape == (2,)
    assert isinstance(envs.single_observation_space, gym.spaces.Discrete)
