"""The env boundary's checks (rlstore/env_checks.py): what an env returns against its
spaces, in one line that names the env and the part; NaN and inf in observations, rewards
and losses stop the run with its last checkpoint kept."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 (registers the test envs)
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

import rlstore
from rlstore.checkpoint import checkpoint_files
from rlstore.cli import main
from rlstore.env_checks import CheckedEnv, EnvContractError, SpaceMismatch, check_observation
from rlstore.env_snapshots import _env_chain, _load_chain
from rlstore.errors import Diverged

BOX = spaces.Box(-1, 1, (3,), np.float32)
IMAGE = spaces.Box(0, 255, (2, 2), np.uint8)
DICT = spaces.Dict({"pos": BOX, "cell": spaces.Discrete(3, start=2)})


@pytest.mark.parametrize(
    "space, obs, expected",
    [
        (
            BOX,
            np.zeros(4, np.float32),
            "float32 shape (4,), where it should give float32 shape (3,)",
        ),
        (BOX, np.zeros((3, 1), np.float32), "shape (3, 1)"),
        (BOX, np.array([0.0, np.nan, 0.0], np.float32), "NaN or inf (nan at index 1)"),
        (BOX, np.array([0.0, 0.0, -np.inf]), "NaN or inf (-inf at index 2)"),
        (BOX, np.array(["a", "b", "c"]), "<U1 shape (3,)"),
        (IMAGE, np.zeros((2, 2), np.float32), "float32 shape (2, 2), where it should give uint8"),
        (spaces.Discrete(3, start=2), 1, "int 1, where it should give an integer in [2, 5)"),
        (spaces.Discrete(3, start=2), 5, "in [2, 5)"),
        (spaces.Discrete(3), 1.0, "float 1.0"),
        (spaces.Discrete(3), np.array([1]), "int64 shape (1,)"),
        (spaces.MultiDiscrete([3, 2]), np.array([3, 0]), "values [3, 0], where it should give"),
        (spaces.MultiDiscrete([3, 2], start=[1, 1]), np.array([0, 1]), "values [0, 1]"),
        (spaces.MultiDiscrete([3, 2]), np.array([0.0, 1.0]), "float64 shape (2,)"),
        (spaces.MultiBinary(2), np.array([0, 2]), "values [0, 2]"),
        (DICT, {"pos": np.zeros(3, np.float32)}, "keys ['pos'], where it should give the keys"),
        (DICT, {"pos": np.zeros(2, np.float32), "cell": 2}, "observation['pos'] of float32"),
        (DICT, {"pos": np.zeros(3, np.float32), "cell": 0}, "observation['cell'] of int 0"),
        (spaces.Tuple([BOX, BOX]), (np.zeros(3, np.float32),), "a tuple of 1, where it should"),
    ],
)
def test_what_breaks_a_space_is_named(space, obs, expected):
    with pytest.raises(SpaceMismatch) as caught:
        check_observation(space, obs, check_finite=True)
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    "space, obs, note",
    [
        (BOX, np.zeros(3), "came as float64 shape (3,); cast to float32"),
        (BOX, [0.0, 0.5, 1.0], "came as a list of 3; cast to float32"),
        (BOX, np.zeros(3, np.int64), "came as int64 shape (3,); cast to float32"),
        (BOX, np.array([0.0, 2.0, 0.0], np.float32), "has values outside Box(-1.0, 1.0"),
        (spaces.MultiBinary(2), [1, 0], "came as a list of 2; cast to int8"),
    ],
)
def test_what_loses_nothing_is_cast_or_noted(space, obs, note):
    checked, notes = check_observation(space, obs, check_finite=True)
    assert notes == [n for n in notes if note in n] and len(notes) == 1
    assert np.asarray(checked).dtype == space.dtype
    np.testing.assert_array_equal(checked, np.asarray(obs).astype(space.dtype))


def test_nan_passes_with_check_finite_off():
    obs = np.array([np.nan, 0, 0], np.float32)
    checked, notes = check_observation(BOX, obs, check_finite=False)
    assert checked is obs and notes == []


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_anything_a_space_samples_passes_as_it_is(data):
    """Invariant: an observation of the space (its own sample) passes unchanged and
    unremarked, Dicts and Tuples of every part kind included."""
    space = data.draw(
        st.sampled_from(
            [
                BOX,
                IMAGE,
                DICT,
                spaces.Discrete(4, start=-2),
                spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [0, -1]]),
                spaces.MultiBinary(5),
                spaces.Tuple([IMAGE, spaces.Dict({"a": spaces.MultiBinary(1), "b": BOX})]),
            ]
        )
    )
    space.seed(data.draw(st.integers(0, 2**31 - 1)))
    obs = space.sample()
    checked, notes = check_observation(space, obs, check_finite=True)
    assert notes == []
    for got, given_part in zip(leaves(checked), leaves(obs), strict=True):
        assert got is given_part


def leaves(tree):
    if isinstance(tree, dict):
        return [leaf for key in tree for leaf in leaves(tree[key])]
    if isinstance(tree, tuple):
        return [leaf for part in tree for leaf in leaves(part)]
    return [tree]


def test_the_fast_test_lets_through_what_the_full_check_does():
    """CheckedEnv.step takes a declared-shape-and-dtype array without the full check: the
    same observation comes back; a float64 one is cast with one warning."""
    env = CheckedEnv(gym.make("space_envs:Broken-v0", mode="float64", at=2))
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32
    first = env.step(0)[0]
    assert first.dtype == np.float32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = env.step(0)[0]
        env.step(0)
    assert second.dtype == np.float32
    assert len([w for w in caught if "cast to float32" in str(w.message)]) <= 1


def test_env_snapshots_skip_the_checks_layer():
    """Checkpoints keep the env's layers only, as before the checks existed: a checkpoint
    written without CheckedEnv loads into envs with it."""
    saved = gym.make("CartPole-v1")
    saved.reset(seed=3)
    saved.step(0)
    chain = _env_chain(saved)  # an older checkpoint's: no checks layer
    checked = CheckedEnv(gym.make("CartPole-v1"))
    checked.reset(seed=9)
    _load_chain(checked, chain)
    assert len(_env_chain(checked)) == len(chain)
    for action in [0, 1, 1, 0, 1, 1]:
        np.testing.assert_array_equal(saved.step(action)[0], checked.step(action)[0])


def broken_run(mode, tmp_path, **config):
    return rlstore.train(
        "ppo",
        env="space_envs:Broken-v0",
        env_kwargs=(f"mode='{mode}'", "at=50"),
        num_envs=2,
        num_steps=32,
        total_timesteps=4096,
        logdir=str(tmp_path),
        progress=False,
        **config,
    )


@pytest.mark.parametrize(
    "mode, says",
    [
        ("nan_obs", "Broken-v0 returned an observation with NaN or inf (nan at index 1)"),
        ("inf_reward", "Broken-v0 returned a reward of inf from step()"),
        ("shape", "Broken-v0 returned an observation of float32 shape (4,) from step()"),
    ],
)
def test_a_broken_env_stops_the_run_in_one_line(mode, says, tmp_path):
    with pytest.raises(EnvContractError) as caught:
        broken_run(mode, tmp_path)
    message = str(caught.value)
    assert says in message and "\n" not in message
    assert "the run stopped at step" in message and "rlstore check-env" in message


def test_the_last_checkpoint_is_kept_and_the_cli_exits_2(tmp_path, capsys):
    """The env's observations turn NaN at its 40th step: a run that checkpoints every 16
    steps stops there, its checkpoints of steps 16 and 32 as they were, no model.pt."""
    args = ["train", "ppo", "--env", "space_envs:Broken-v0", "--num-envs", "1"]
    args += ["--num-steps", "16", "--total-timesteps", "512", "--checkpoint-every", "16"]
    args += ["--no-progress", "--logdir", str(tmp_path), "--env-kwargs", "mode='nan_obs'"]
    assert main([*args, "at=40"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "; the run stopped at step 40: its newest checkpoint, step_000000000032.pt" in err
    (run_dir,) = tmp_path.iterdir()
    kept = checkpoint_files(run_dir / "checkpoints")
    assert [p.name for p in kept] == ["step_000000000032.pt", "step_000000000016.pt"]
    assert not (run_dir / "model.pt").exists()


def test_a_loss_that_overflows_stops_the_run_naming_it(tmp_path):
    with pytest.raises(Diverged, match=r"losses/value_loss became inf by step [\d,]+: the upd"):
        broken_run("huge_reward", tmp_path / "on")
    assert not list((tmp_path / "on").rglob("model.pt"))
    # --check-finite off: the user's choice; the run ends (the loss is inf)
    broken_run("huge_reward", tmp_path / "off", check_finite="off")
    broken_run("nan_obs", tmp_path / "off", check_finite="off")


class Shell(gym.Env):
    """An env of a given observation space, for CheckedEnv's fast test."""

    def __init__(self, space):
        self.observation_space, self.action_space = space, spaces.Discrete(2)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_the_fast_test_passes_only_what_the_full_check_passes_unchanged(seed):
    """A Dict of a float Box and a Discrete part (MiniGrid's kind): samples pass the fast
    test, and so does the full check, unchanged; each broken copy fails the fast test."""
    space = spaces.Dict({"pos": BOX, "cell": spaces.Discrete(3, start=2)})
    space.seed(seed)
    checked = CheckedEnv(Shell(space))
    obs = space.sample()
    assert checked._fits(obs) and check_observation(space, obs, True) == (obs, [])
    assert checked._fits({**obs, "cell": int(obs["cell"])})  # a Python int too
    nan = obs["pos"].copy()
    nan[seed % 3] = np.nan
    for broken in (
        {**obs, "pos": nan},
        {**obs, "pos": obs["pos"].astype(np.float64)},
        {**obs, "cell": np.int64(5)},
        {"pos": obs["pos"]},
    ):
        assert not checked._fits(broken)
