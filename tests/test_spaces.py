"""Training on the observation spaces beyond Box vectors, end to end: Discrete (FrozenLake),
MultiBinary, small uint8 images and Discrete states with continuous actions, for every
algorithm that takes them: the storage keeps the env's dtype, a run resumes bitwise, and
load_policy and `rlstore eval` play the saved policy."""

import gymnasium
import numpy as np
import pytest
import space_envs  # noqa: F401 (registers the test envs)
import torch
from extras import needs
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from tiny_runs import SETUPS, replace, resumes_bitwise

import rlstore
from rlstore.evaluate import evaluate

# (algorithm, env): every encoder, and every algorithm on at least one new space
CASES = [
    ("ppo", "FrozenLake-v1"),
    ("ppo", "ColorImage-v0"),
    ("a2c", "BitParity-v0"),
    ("dqn", "FrozenLake-v1"),
    ("dqn", "ColorImage-v0"),
    ("ppo_lstm", "BitParity-v0"),
    ("sac", "DiscreteTarget-v0"),
    ("td3", "DiscreteTarget-v0"),
    ("ddpg", "DiscreteTarget-v0"),
    ("ppo", "PickTwo-v0"),
    ("a2c", "CopyBits-v0"),
    ("ppo", "DictTarget-v0"),
    ("dqn", "DictTarget-v0"),
    ("ppo_lstm", "TupleCount-v0"),
    ("a2c", "TupleCount-v0"),
    ("sac", "DictScale-v0"),
    ("td3", "DictScale-v0"),
    ("a2c", "BoxGrid-v0"),
    ("ddpg", "BoxGrid-v0"),
]
TEST_ENVS = (
    "ColorImage",
    "BitParity",
    "DiscreteTarget",
    "PickTwo",
    "CopyBits",
    "DictTarget",
    "TupleCount",
    "DictScale",
    "Mission",
    "BoxGrid",
)


@pytest.mark.parametrize("algo, env_id", CASES)
def test_a_run_on_the_space_resumes_bitwise_and_its_policy_plays(
    algo, env_id, tmp_path, monkeypatch
):
    from rlstore import env_snapshots

    # the test envs' state is plain attributes, as the saveable envs' (their class names)
    monkeypatch.setattr(env_snapshots, "SAVEABLE_ENVS", env_snapshots.SAVEABLE_ENVS + TEST_ENVS)
    module, cfg = SETUPS[algo]
    cfg = replace(cfg, env_id=env_id, logdir=str(tmp_path), max_episode_steps=None)
    full = resumes_bitwise(module, cfg)
    policy = rlstore.load_policy(full.run_dir)
    if env_id == "FrozenLake-v1":
        obs_space = spaces.Discrete(16)
    else:
        obs_space = getattr(space_envs, env_id.removesuffix("-v0")).observation_space
    one = obs_space.sample()
    batch = batch_space(obs_space, 3).sample()
    action, actions = policy(one), policy(batch)
    assert np.shape(actions)[0] == 3 and np.shape(action) == np.shape(actions)[1:]
    result = evaluate(full.run_dir, episodes=2)
    assert len(result["returns"]) == 2


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_multi_discrete_and_multi_binary_actions_are_learnt(algo, tmp_path):
    """PickTwo pays 2 a step to the best policy and 5/6 on average to a uniform one (5 steps
    an episode); CopyBits 3 and 1.5. The env raises on an action outside its space."""
    for env_id, best in (("PickTwo-v0", 10.0), ("CopyBits-v0", 15.0)):
        result = rlstore.train(
            algo,
            env=env_id,
            total_timesteps=6000,
            logdir=str(tmp_path),
            progress=False,
            learning_rate=3e-3,
        )
        scores = evaluate(result.run_dir, episodes=4)
        assert scores["returns"] == [best] * 4, (env_id, scores["returns"])


def stored_observations(algo, env_id, part, tmp_path, **changes):
    """The observations tensor of the run's storage (`part`: "storage" or "buffer") after
    a short run of the tiny setup of `algo` on `env_id`."""
    module, cfg = SETUPS[algo]
    seen = {}

    class Look(rlstore.Callback):
        def on_iteration(self, run):
            seen["obs"] = run.state.parts[part].obs

    module.train(replace(cfg, env_id=env_id, logdir=str(tmp_path), **changes), callbacks=[Look()])
    return seen["obs"]


def test_frozen_lake_is_stored_as_int64_states(tmp_path):
    obs = stored_observations("ppo", "FrozenLake-v1", "storage", tmp_path, total_timesteps=512)
    assert obs.dtype == torch.int64 and obs.shape[2:] == ()


def test_images_stay_uint8_in_the_replay_buffer(tmp_path):
    obs = stored_observations("dqn", "ColorImage-v0", "buffer", tmp_path, total_timesteps=600)
    assert obs.dtype == torch.uint8 and tuple(obs.shape[2:]) == (7, 7, 3)


@pytest.mark.parametrize("algo", ["ppo", "a2c", "ppo_lstm"])
def test_hidden_sets_the_widths_of_the_saved_policy(algo, tmp_path):
    """--hidden 8 16: the actor's and critic's Linear layers, in the run's model.pt too."""
    module, cfg = SETUPS[algo]
    result = module.train(replace(cfg, logdir=str(tmp_path), hidden=(8, 16)))
    network = rlstore.load_policy(result.run_dir).network
    for mlp in (network.actor, network.critic):
        widths = [layer.out_features for layer in mlp if isinstance(layer, torch.nn.Linear)]
        assert widths[:-1] == [8, 16]


def test_dict_and_tuple_observations_are_learnt_from_every_part(tmp_path):
    """DictTarget pays 1 a step for naming (image channel + offset) % 3, which needs both
    parts (a policy that sees one part scores at most 1/2); TupleCount likewise needs the
    Discrete and the MultiBinary part (at most 1/2 from one); 5 steps an episode.
    DictTarget's 6x6 image is of pixels (0 or 255), which --image-scale 255 says (the small
    CNN takes small images for grids of symbols, unscaled, by default)."""
    for algo, env_id in (("ppo", "DictTarget-v0"), ("dqn", "TupleCount-v0")):
        more = dict(learning_starts=500, exploration_fraction=0.3) if algo == "dqn" else {}
        more |= {"image_scale": 255.0} if env_id == "DictTarget-v0" else {}
        result = rlstore.train(
            algo,
            env=f"space_envs:{env_id}",
            total_timesteps=10_000,
            learning_rate=3e-3,
            logdir=str(tmp_path),
            progress=False,
            **more,
        )
        scores = evaluate(result.run_dir, episodes=4)
        assert scores["returns"] == [5.0] * 4, (algo, env_id, scores["returns"])


def test_a_dict_part_left_out_with_drop_obs_keys(tmp_path):
    """Mission's text part cannot be encoded: --drop-obs-keys mission trains on the rest,
    and `rlstore eval` and load_policy rebuild the env without it (config.json)."""
    result = rlstore.train(
        "ppo",
        env="space_envs:Mission-v0",
        drop_obs_keys=("mission",),
        total_timesteps=6000,
        learning_rate=3e-3,
        logdir=str(tmp_path),
        progress=False,
    )
    assert evaluate(result.run_dir, episodes=2)["returns"] == [5.0, 5.0]
    policy = rlstore.load_policy(result.run_dir)
    assert policy({"state": 2}) == 2 and list(policy({"state": np.array([0, 1])})) == [0, 1]


def test_box_actions_of_two_dimensions_are_learnt_flat_and_reshaped_for_the_env(tmp_path):
    """BoxGrid raises on an action that is not 2x2: SAC acts in the flat (4,) box, the env
    gets (2, 2); every entry is learnt on the right side of its target (a zero action scores
    -1.25 an episode, and so does one entry of the four on the wrong side); load_policy
    gives actions in the env's shape. Each step's reward is its own action's (a contextual
    bandit), so gamma 0 and small networks learn it in 2,000 steps."""
    result = rlstore.train(
        "sac",
        env="space_envs:BoxGrid-v0",
        total_timesteps=2000,
        learning_starts=500,
        gamma=0.0,
        hidden=(64, 64),
        logdir=str(tmp_path),
        progress=False,
    )
    assert min(evaluate(result.run_dir, episodes=4)["returns"]) > -0.5
    policy = rlstore.load_policy(result.run_dir)  # actions in the env's own shape
    env = gymnasium.make("BoxGrid-v0")  # the env itself, without rlstore's wrappers
    obs, _ = env.reset(seed=0)
    env.step(policy(obs))  # (it raises on an action that is not 2x2)
    assert policy(np.ones(2, np.float32)).shape == (2, 2)
    assert policy(np.ones((3, 2), np.float32)).shape == (3, 2, 2)
    assert policy.q_values(np.ones(2, np.float32)).shape == (2,)


def test_cnn_channels_image_scale_and_the_dqn_hidden_alias_shape_the_saved_policy(tmp_path):
    for algo, flags in (("ppo", {}), ("dqn", {"learning_starts": 100})):
        result = rlstore.train(
            algo,
            env="space_envs:ColorImage-v0",
            cnn_channels=(4, 8),
            image_scale=4.0,
            total_timesteps=600,
            logdir=str(tmp_path),
            progress=False,
            **flags,
        )
        policy = rlstore.load_policy(result.run_dir)
        encoder = policy.network.encoder
        convs = [m for m in encoder.cnn if isinstance(m, torch.nn.Conv2d)]
        assert [c.out_channels for c in convs] == [4, 8]
        assert encoder.scale == 4.0 and policy.info["observation"]["scale"] == 4.0
    from rlstore.cli import main

    args = ["--total-timesteps", "600", "--learning-starts", "100", "--no-progress"]
    assert main(["train", "dqn", "--hidden", "16", "--logdir", str(tmp_path), *args]) == 0
    (run,) = tmp_path.glob("CartPole-v1__dqn__*")
    assert rlstore.load_policy(run).network.hidden == (16,)


@needs("minigrid", "minigrid")
def test_minigrid_trains_on_its_dict_without_the_mission(tmp_path, capsys):
    """MiniGrid's observation: a 7x7x3 image, a direction and a text mission, which is
    refused with the fix that --drop-obs-keys is; with it, PPO trains and rlstore eval
    plays (the image through the small CNN, the direction one-hot)."""
    from rlstore.cli import main

    env = ["--env", "MiniGrid-DoorKey-5x5-v0", "--logdir", str(tmp_path), "--no-progress"]
    assert main(["train", "ppo", *env]) == 2
    assert "--drop-obs-keys mission" in capsys.readouterr().err
    assert (
        main(["train", "ppo", *env, "--drop-obs-keys", "mission", "--total-timesteps", "1024"]) == 0
    )
    (run,) = tmp_path.glob("MiniGrid-DoorKey-5x5-v0__ppo__*")
    assert main(["eval", str(run), "--episodes", "2"]) == 0
