"""Configs (rlstore/config.py and each algorithm's class): precedence, presets, the range
of every bounded field."""

import re

import gymnasium as gym
import pytest

from rlstore import algos, config, presets
from rlstore.cli import parse_train


def test_precedence_defaults_preset_config_flags(tmp_path, monkeypatch):
    preset_dir = tmp_path / "configs"
    (preset_dir / "ppo").mkdir(parents=True)
    (preset_dir / "ppo" / "Acrobot-v1.toml").write_text(
        "num_envs = 8\nlearning_rate = 1e-3\nseed = 5\n"
    )
    monkeypatch.setattr(presets, "PRESET_DIR", preset_dir)
    user = tmp_path / "mine.toml"
    user.write_text("learning_rate = 3e-4\nnum_steps = 64\nseed = 6\n")

    _, cfg, preset = parse_train(["ppo"])
    assert preset is None and cfg.num_envs == 4  # no preset for CartPole-v1 here
    _, cfg, preset = parse_train(["ppo", "--env", "Acrobot-v1"])
    assert preset == preset_dir / "ppo" / "Acrobot-v1.toml"
    assert (cfg.num_envs, cfg.learning_rate, cfg.seed) == (8, 1e-3, 5)  # preset over defaults
    _, cfg, _ = parse_train(["ppo", "--env", "Acrobot-v1", "--config", str(user)])
    assert (cfg.num_envs, cfg.learning_rate, cfg.num_steps, cfg.seed) == (8, 3e-4, 64, 6)
    _, cfg, _ = parse_train(["ppo", "--env=Acrobot-v1", f"--config={user}", "--seed", "9"])
    assert (cfg.learning_rate, cfg.seed) == (3e-4, 9)  # flags over everything


def test_shipped_presets_are_valid():
    found = sorted(p for p in presets.PRESET_DIR.glob("*/*.toml") if p.parent.name != "suites")
    names = {f"{p.parent.name}/{p.name}" for p in found}
    assert {"ppo/CartPole-v1.fast.toml", "dqn/CartPole-v1.fast.toml"} <= names
    for path in found:
        algo = path.parent.name
        cfg = presets.apply_overrides(
            algos.get(algo).config(), presets.read_config(path, "preset"), str(path)
        )
        config.validate(cfg)  # raises UsageError for an invalid preset
        env_id = re.match(r"^(.*?-v\d+)", path.name)  # Env-vN.toml or Env-vN.NAME.toml
        assert path.stem in presets.FAMILIES or env_id.group(1) in gym.registry, path


@pytest.mark.parametrize("env_id", ["HalfCheetah-v4", "Hopper-v5", "Walker2d-v4", "Ant-v5"])
def test_mujoco_ids_get_the_published_continuous_control_defaults(env_id):
    cfg, preset = presets.resolve("ppo", env_id)
    assert preset == presets.PRESET_DIR / "ppo" / "mujoco.toml"
    expected = dict(
        num_envs=1,
        num_steps=2048,
        learning_rate=3e-4,
        anneal_lr=True,
        update_epochs=10,
        num_minibatches=32,
        gamma=0.99,
        gae_lambda=0.95,
        clip_coef=0.2,
        clip_vloss=True,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        norm_adv=True,
        norm_obs=True,
        norm_reward=True,
        total_timesteps=1_000_000,
    )
    assert {k: getattr(cfg, k) for k in expected} == expected
    cfg, preset = presets.resolve("ppo", env_id, {"norm_reward": False})  # flags still win
    assert not cfg.norm_reward and cfg.norm_obs
    assert presets.resolve("a2c", env_id)[1] is None  # the family preset is PPO's


def test_box2d_presets_name_their_source():
    for name in (
        "ppo/LunarLander-v3",
        "dqn/LunarLander-v3",
        "ppo/BipedalWalker-v3",
        "ppo/Pendulum-v1",
    ):
        text = (presets.PRESET_DIR / f"{name}.toml").read_text()
        assert "RL Baselines3 Zoo" in text and "hyperparams/" in text
    # A2C's zoo values did not learn LunarLander-v3: the preset says so and whose it is
    text = (presets.PRESET_DIR / "a2c/LunarLander-v3.toml").read_text()
    assert "RL Baselines3 Zoo" in text and "rlstore's own values" in text
    cfg, _ = presets.resolve("dqn", "LunarLander-v3")
    assert cfg.q_hidden == (256, 256) and cfg.loss == "huber"


def test_every_bounded_field_is_checked_before_anything_is_built():
    """Each numeric field with a natural range refuses a value just outside it, naming
    its flag; the check reads the ranges off the config's own fields."""
    import dataclasses
    import typing

    from rlstore import algos
    from rlstore.config import _bound, flag, validate
    from rlstore.errors import UsageError

    checked = 0
    for cls in (algorithm.config for algorithm in algos.all_algorithms()):
        hints = typing.get_type_hints(cls, include_extras=True)
        for field in dataclasses.fields(cls):
            bound = _bound(hints[field.name])
            if bound is None:
                continue
            low = bound.low - (0 if bound.low_open else 1)
            for bad in [low] + ([bound.high + 0.5] if bound.high is not None else []):
                with pytest.raises(UsageError, match=f"^{flag(field.name)} must "):
                    validate(dataclasses.replace(cls(), **{field.name: bad}))
                checked += 1
    assert checked >= 60  # every learning rate, coefficient, count and fraction
