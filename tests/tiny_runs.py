"""Small training runs that the checkpoint and evaluation tests share."""

import dataclasses
from pathlib import Path

import torch

from rlstore.algos import (
    a2c,
    c51,
    crossq,
    ddpg,
    dqn,
    ppo,
    ppo_lstm,
    pqn,
    qrdqn,
    rainbow,
    sac,
    td3,
    tqc,
)
from rlstore.algos.a2c import A2CConfig
from rlstore.algos.ddpg import DDPGConfig
from rlstore.algos.dqn import DQNConfig
from rlstore.algos.ppo import PPOConfig
from rlstore.algos.sac import SACConfig
from rlstore.algos.td3 import TD3Config
from rlstore.callbacks import Callback

COMMON = dict(device="cpu", progress=False, max_episode_steps=60, keep_checkpoints=100)
SETUPS = {
    "ppo": (ppo, PPOConfig(total_timesteps=8 * 256, num_steps=64, checkpoint_every=768, **COMMON)),
    "a2c": (a2c, A2CConfig(total_timesteps=3000, checkpoint_every=1000, **COMMON)),
    "dqn": (
        dqn,
        DQNConfig(
            total_timesteps=2500,
            learning_starts=400,
            buffer_size=500,
            batch_size=32,
            target_network_frequency=200,
            n_step=3,
            prioritized=True,
            num_envs=2,
            checkpoint_every=1000,
            **COMMON,
        ),
    ),
}
# SAC, TD3 and DDPG on Pendulum with two envs, truncated every 60 steps, small networks
OFF_POLICY = dict(
    env_id="Pendulum-v1",
    total_timesteps=1200,
    learning_starts=300,
    num_envs=2,
    buffer_size=600,
    batch_size=32,
    hidden=(32, 32),
    checkpoint_every=300,
    **COMMON,
)
SETUPS["sac"] = (sac, SACConfig(**OFF_POLICY))
SETUPS["td3"] = (td3, TD3Config(**OFF_POLICY))
SETUPS["ddpg"] = (ddpg, DDPGConfig(**OFF_POLICY))
SETUPS["tqc"] = (tqc, tqc.TQCConfig(n_critics=3, n_quantiles=5, **OFF_POLICY))
SETUPS["crossq"] = (crossq, crossq.CrossQConfig(critic_hidden=(32, 32), **OFF_POLICY))
# recurrent PPO on a partially observable CartPole, small LSTMs, sequences of 16 steps
SETUPS["ppo_lstm"] = (
    ppo_lstm,
    ppo_lstm.PPOLSTMConfig(
        env_id="CartPoleNoVel-v1",
        total_timesteps=6 * 128,
        num_steps=32,
        sequence_length=16,
        lstm_hidden_size=16,
        checkpoint_every=256,
        **COMMON,
    ),
)
# DQN's variants: DQN's tiny replay settings, small distributional heads
VARIANTS = dict(
    total_timesteps=2500,
    learning_starts=400,
    buffer_size=500,
    batch_size=32,
    target_network_frequency=200,
    num_envs=2,
    q_hidden=(32, 32),
    checkpoint_every=1000,
    **COMMON,
)
SETUPS["c51"] = (c51, c51.C51Config(n_atoms=11, v_min=-10.0, v_max=10.0, **VARIANTS))
SETUPS["qrdqn"] = (qrdqn, qrdqn.QRDQNConfig(n_quantiles=8, **VARIANTS))
# Rainbow: all its pieces (noisy layers, dueling, Double, 3-step returns, PER)
SETUPS["rainbow"] = (rainbow, rainbow.RainbowConfig(n_atoms=11, **VARIANTS))
SETUPS["pqn"] = (
    pqn,
    pqn.PQNConfig(total_timesteps=6 * 4 * 64, num_steps=64, checkpoint_every=512, **COMMON),
)


def resumes_bitwise(module, cfg):
    """Train `cfg`, then resume it from a middle checkpoint as if it had died there: the
    same returns and parameters at the end. Returns the full run's result."""
    from rlstore.checkpoint import checkpoint_files

    full = module.train(cfg)
    saved = checkpoint_files(full.run_dir / "checkpoints")
    assert len(saved) >= 3
    middle = saved[len(saved) // 2]
    for later in saved[: len(saved) // 2]:  # as if the run had died after `middle`
        later.unlink()
    (full.run_dir / "model.pt").unlink()
    resumed = module.train(cfg, resume=full.run_dir)
    assert resumed.global_step == full.global_step
    assert resumed.episode_returns == full.episode_returns
    assert same_params(params(resumed.model), params(full.model))
    assert int(middle.name[5:-3]) < full.global_step
    return full


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def replace(cfg, **changes):
    return dataclasses.replace(cfg, **changes)


def only_run_dir(logdir) -> Path:
    """The one run directory in `logdir`."""
    dirs = list(Path(logdir).iterdir())
    assert len(dirs) == 1
    return dirs[0]


class Watch(Callback):
    """Calls `fn(run)` after every iteration of a run (for DQN: every vector step)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def on_iteration(self, run) -> None:
        self.fn(run)
