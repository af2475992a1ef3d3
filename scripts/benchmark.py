"""rlstore against stable-baselines3, side by side in one command, on CartPole-v1 (or, for
PPO, a MuJoCo env at the continuous-control defaults).

    pip install -e ".[bench]"
    python scripts/benchmark.py                        # PPO and DQN, seeds 1-3
    python scripts/benchmark.py --algos ppo --seeds 1 --ppo-steps 100000
    python scripts/benchmark.py --algos ppo --device cuda --ppo-envs 1024 --ppo-steps 2000000
    python scripts/benchmark.py --parallel 1 2 3        # K copies of one command at once
    python scripts/benchmark.py --algos ppo --env HalfCheetah-v4 --ppo-steps 100000 \
        --out results/benchmark-halfcheetah                 # PPO's MuJoCo defaults
    python scripts/benchmark.py --algos ppo --env BreakoutNoFrameskip-v4 --ppo-steps 20480 \
        --out results/benchmark-atari                       # PPO's Atari defaults

Each run is its own process (so imports and start-up count), runs alternate between the
two trainers seed by seed, and every run is single-threaded. Per run: env steps/s, seconds
from launch until the mean return of the last 20 episodes first reaches 475 ('-' if it does
not within the budget), and peak RSS. Then the ratios rlstore / SB3 (medians), and the floor
of the PPO batch shape: raw env step time and policy forward time, against which rlstore's
collect loop is compared. Writes results/benchmark.json and results/benchmark.md.

--parallel K...: runs K copies of `rlstore train ALGO --env CartPole-v1 --total-timesteps
N` as users run it (the console command, default options and threads, seeds 1..K) at the
same time, for each K, and reports the aggregate env steps/s (the sum of the copies' own
steps/s) and the wall time. Runs sharing the cores must not collapse: the aggregate at K = 3
on 2 cores should be at least the K = 1 figure. Writes results/parallel-latest.md and .json
(results/parallel.md holds the before/after figures).

--env BreakoutNoFrameskip-v4 (PPO only, any Atari id): rlstore at its Atari defaults (8 envs
x 128 steps, 4 epochs x 4 minibatches, the Nature CNN, ale-py's vector env), SB3's PPO
with CnnPolicy at the same settings on its make_atari_env + VecFrameStack(4); the floor is
the vector env step plus the CNN forward of 8 observations.

--env HalfCheetah-v4 (PPO only): rlstore at the defaults it applies to MuJoCo ids (1 env x
2048 steps, 10 epochs x 32 minibatches, lr 3e-4 annealed, observation and reward
normalization), SB3's PPO at the same settings with VecNormalize (its value clipping at
0.2, as rlstore's); the floor is one env step plus the policy forward.

--algos ppo_lstm (on CartPoleNoVel-v1, its default env): recurrent PPO at its preset
(configs/ppo_lstm/CartPoleNoVel-v1.toml: 8 envs x 128 steps, 4 minibatches, 10 epochs, an
LSTM of 256 for the actor and one for the critic, 64-64 tanh heads, lr and clip annealed,
observation and reward normalization) against sb3-contrib's RecurrentPPO with
MlpLstmPolicy at the same settings and VecNormalize, from --lstm-steps steps. No floor.

--algos sac td3 ddpg --env HalfCheetah-v4: SAC, TD3 and DDPG at CleanRL's defaults (batch
256, 256-256 networks, buffer 1M, tau 0.005, gamma 0.99, policy delay 2; SAC's entropy
coefficient tuned; TD3's exploration noise 0.1, target noise 0.2 clipped at 0.5; DDPG's
noise 0.1, one critic, no target noise), SB3's SAC and TD3 at the same settings (SB3's SAC
updates its actor at every step, CleanRL's twice at every second: the same count; for DDPG,
SB3's TD3 with one critic, no target noise and CleanRL's delay of 2, since SB3's DDPG fixes
its delay at 1), both learning from step --offpolicy-starts. Their floor is
the update's arithmetic: the FLOPs of one gradient step's matrix products at this
machine's measured matrix-product rate (torch, the run's threads), as env steps/s.

Hyperparameters match: A2C with rlstore's CartPole settings (8 envs x 5 steps, RMSprop 7e-4,
eps 1e-5, no entropy bonus, GAE lambda 1, 64-64 tanh; SB3's A2C defaults otherwise, with
--ppo-steps steps); PPO with the foundation defaults (4 envs x 128 steps, 4 epochs x 4
minibatches, lr 2.5e-4 annealed, clip 0.2 with value clipping, 64-64 tanh actor and critic,
Adam eps 1e-5); DQN with the classic CartPole reference (120-84 ReLU, buffer 10k, batch 128,
train every 10 steps, target every 500, epsilon 1 -> 0.05 over half) and SB3's Huber loss on
both sides (SB3 has no MSE option); SB3's DQN gradient clipping is switched off as rlstore's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WINDOW, THRESHOLD = 20, 475.0

# The environment this script started with, for its children: importing rlstore here sets
# OMP_WAIT_POLICY=PASSIVE in this process (rlstore/__init__.py), and SB3's children would
# inherit it; they must run at torch's own wait policy, as SB3's users do. (Until this was
# fixed, SB3 at two threads ran at half its speed in the --default-threads benchmarks.)
USER_ENV = dict(os.environ)


def first_reach(returns: list[float], times: list[float]) -> float | None:
    for i in range(WINDOW - 1, len(returns)):
        if sum(returns[i - WINDOW + 1 : i + 1]) / WINDOW >= THRESHOLD:
            return times[i]
    return None


# -- children: one training run each, printing one JSON line -----------------------------------


def child_rlstore(
    algo: str,
    seed: int,
    steps: int,
    launch: float,
    device: str,
    ppo_envs: int | None,
    config: str,
    env: str = "CartPole-v1",
    one_thread: bool = True,
    offpolicy_starts: int = 1000,
) -> dict:
    import importlib
    import tempfile

    # rlstore before torch, as `rlstore train` loads them, so that its OpenMP wait policy holds
    importlib.import_module("rlstore")
    import torch

    if one_thread:  # else each trainer's own default (rlstore's auto, torch's for SB3)
        torch.set_num_threads(1)
    from rlstore.presets import resolve

    with tempfile.TemporaryDirectory() as logdir:
        overrides = dict(
            seed=seed,
            total_timesteps=steps,
            logdir=logdir,
            progress=False,
            device=device,
            checkpoint_every=0,
        )
        if algo == "ppo" and ppo_envs:  # asked for: over the preset and any config file
            overrides["num_envs"] = ppo_envs
        if config:
            overrides["config"] = config
        elif algo == "dqn":
            overrides["loss"] = "huber"
        if algo in OFF_POLICY:
            overrides["learning_starts"] = offpolicy_starts
        cfg, preset = resolve(algo, env, overrides)
        from rlstore import algos

        result = algos.get(algo).train(cfg, preset)
    reach = first_reach(result.episode_returns, result.episode_times)
    return {"sps": result.sps, "to_475_s": None if reach is None else reach - launch}


def child_sb3(
    algo: str,
    seed: int,
    steps: int,
    launch: float,
    device: str,
    ppo_envs: int,
    env: str = "CartPole-v1",
    one_thread: bool = True,
    offpolicy_starts: int = 1000,
) -> dict:
    import torch

    if one_thread:  # else each trainer's own default (rlstore's auto, torch's for SB3)
        torch.set_num_threads(1)
    from stable_baselines3 import DQN, PPO, SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger

    class Watch(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns, self.times = [], []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.returns.append(info["episode"]["r"])
                    self.times.append(time.time())
            return True

    watch = Watch()
    # What both PPO settings share (rlstore's defaults): GAE 0.95, clip 0.2 on the policy
    # and the value, value coef 0.5, max grad norm 0.5, a linearly annealed learning rate.
    ppo_common = dict(
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        clip_range_vf=0.2,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        device=device,
    )
    if algo in OFF_POLICY:  # CleanRL's defaults, as rlstore's SAC, TD3 and DDPG
        import numpy as np
        from stable_baselines3.common.noise import NormalActionNoise

        envs = make_vec_env(env, n_envs=1, seed=seed)
        common = dict(
            buffer_size=1_000_000,
            learning_starts=offpolicy_starts,
            batch_size=256,
            tau=0.005,
            gamma=0.99,
            policy_kwargs={"net_arch": [256, 256]},
            seed=seed,
            device=device,
        )
        if algo == "sac":
            model = SAC("MlpPolicy", envs, learning_rate=3e-4, ent_coef="auto", **common)
        else:
            scale = (envs.action_space.high - envs.action_space.low) / 2
            noise = NormalActionNoise(np.zeros_like(scale), 0.1 * scale)
            smoothing = dict(target_policy_noise=0.2, target_noise_clip=0.5)
            if algo == "ddpg":  # CleanRL's DDPG: TD3 with one critic and no smoothing
                smoothing = dict(target_policy_noise=0.0, target_noise_clip=0.0)
                common["policy_kwargs"] = {**common["policy_kwargs"], "n_critics": 1}
            model = TD3(
                "MlpPolicy",
                envs,
                learning_rate=3e-4,
                action_noise=noise,
                policy_delay=2,
                **smoothing,
                **common,
            )
    elif algo == "ppo_lstm":
        model = sb3_recurrent_ppo(env, seed, device)
    elif is_atari_id(env):  # PPO's Atari defaults, as rlstore's configs/ppo/atari.toml
        import ale_py
        import gymnasium
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack

        gymnasium.register_envs(ale_py)

        # SB3's AtariWrapper: 30 no-ops, skip 4 with max-pool, FIRE reset, 84x84 gray,
        # rewards clipped; its end-of-life episodes give the same bootstrap cut. v5 ids skip
        # 4 frames themselves and stick actions: both off, so the wrapper does the skipping.
        env_kwargs = {"frameskip": 1, "repeat_action_probability": 0.0} if "/" in env else {}
        envs = make_atari_env(env, n_envs=ppo_envs, seed=seed, env_kwargs=env_kwargs)
        model = PPO(
            "CnnPolicy",
            VecFrameStack(envs, 4),
            n_steps=128,
            batch_size=ppo_envs * 128 // 4,
            n_epochs=4,  # 4 minibatches
            learning_rate=lambda f: 2.5e-4 * f,
            ent_coef=0.01,
            **{**ppo_common, "clip_range": 0.1, "clip_range_vf": 0.1},
        )
    elif env != "CartPole-v1":  # PPO's MuJoCo defaults, as rlstore's configs/ppo/mujoco.toml
        from stable_baselines3.common.vec_env import VecNormalize

        envs = VecNormalize(make_vec_env(env, n_envs=1, seed=seed), gamma=0.99)
        model = PPO(
            "MlpPolicy",
            envs,
            n_steps=2048,
            batch_size=64,
            n_epochs=10,  # 32 minibatches
            learning_rate=lambda f: 3e-4 * f,
            ent_coef=0.0,
            **ppo_common,
        )
    elif algo == "a2c":  # rlstore's A2C on CartPole-v1: its defaults and preset (8 envs)
        from stable_baselines3 import A2C

        envs = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
        model = A2C(
            "MlpPolicy",
            envs,
            n_steps=5,
            learning_rate=7e-4,
            gamma=0.99,
            gae_lambda=1.0,
            ent_coef=0.0,
            vf_coef=0.5,
            max_grad_norm=0.5,
            rms_prop_eps=1e-5,
            normalize_advantage=False,
            seed=seed,
            device=device,
        )
    elif algo == "ppo":
        envs = make_vec_env("CartPole-v1", n_envs=ppo_envs, seed=seed)
        model = PPO(
            "MlpPolicy",
            envs,
            n_steps=128,
            batch_size=ppo_envs * 128 // 4,  # 4 minibatches
            n_epochs=4,
            learning_rate=lambda f: 2.5e-4 * f,
            ent_coef=0.01,
            **ppo_common,
        )
    else:
        envs = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
        model = DQN(
            "MlpPolicy",
            envs,
            learning_rate=2.5e-4,
            buffer_size=10_000,
            learning_starts=10_000,
            batch_size=128,
            tau=1.0,
            gamma=0.99,
            train_freq=10,
            gradient_steps=1,
            target_update_interval=500,
            exploration_fraction=0.5,
            exploration_initial_eps=1.0,
            exploration_final_eps=0.05,
            max_grad_norm=1e10,
            policy_kwargs={"net_arch": [120, 84]},
            seed=seed,
            device=device,
        )
    model.set_logger(Logger(None, []))  # SB3's default makes an empty /tmp/SB3-<date> per run
    start = time.time()
    model.learn(steps, callback=watch)
    seconds = time.time() - start
    reach = first_reach(watch.returns, watch.times)
    return {"sps": steps / seconds, "to_475_s": None if reach is None else reach - launch}


def sb3_recurrent_ppo(
    env: str, seed: int, device: str = "auto", n_steps: int = 128, n_epochs: int = 10
):
    """sb3-contrib's RecurrentPPO at rlstore's ppo_lstm CartPoleNoVel-v1 preset (RL Zoo's
    tuned values, VecNormalize; rollouts of 128 steps in minibatches of 256, 10 epochs), the
    comparator here; scripts/recurrent_reference.py asks for the zoo's own 32 steps and 20
    epochs (one minibatch)."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from rlstore.partially_observable import register

    register()  # CartPoleNoVel-v1 and PendulumNoVel-v1, for gymnasium.make
    envs = VecNormalize(make_vec_env(env, n_envs=8, seed=seed), gamma=0.98)
    return RecurrentPPO(
        "MlpLstmPolicy",
        envs,
        n_steps=n_steps,
        batch_size=256,
        n_epochs=n_epochs,
        gae_lambda=0.8,
        gamma=0.98,
        ent_coef=0.0,
        learning_rate=lambda f: 1e-3 * f,
        clip_range=lambda f: 0.2 * f,
        seed=seed,
        device=device,
    )


def is_atari_id(env: str) -> bool:
    from rlstore.presets import FAMILIES

    return bool(FAMILIES["atari"].match(env))


def child_floor(device_name: str, num_envs: int, env: str = "CartPole-v1") -> dict:
    """The PPO batch shape's floor: a raw env step (the vector env the run uses) and a
    policy forward."""
    import torch

    torch.set_num_threads(1)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")  # as a run sets it
    from rlstore.envs import make_vec_env
    from rlstore.run import Run

    def per_call(fn, n=5000):
        for _ in range(300):
            fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n

    from rlstore.networks import actor_critic_for
    from rlstore.presets import resolve

    device = torch.device(device_name)
    envs = make_vec_env(env, num_envs, seed=0)
    envs.reset(seed=0)
    action = envs.action_space.sample() * 0
    env_s = per_call(lambda: envs.step(action), n=2000 if not is_atari_id(env) else 300)
    space = envs.single_observation_space
    net = actor_critic_for(space, envs.single_action_space).to(device)
    obs = torch.zeros(
        num_envs, *space.shape, dtype=torch.uint8 if is_atari_id(env) else None, device=device
    )

    def forward():  # the forward ends at the env boundary: actions on the host
        if is_atari_id(env):  # the Nature CNN trunk is shared
            hidden = net.trunk(obs)
            return net.actor(hidden).cpu(), net.critic(hidden)
        return net.actor(obs).cpu(), net.critic(obs)

    with torch.inference_mode():
        forward_s = per_call(forward, n=2000 if space.dtype != "uint8" else 200)
    forward_kind = "torch"
    if hasattr(net, "actor_path") and device.type == "cpu":  # the numpy forward, if cheaper (MLPs)
        from rlstore.host_networks import HostViews, numpy_mlp

        actor, critic = HostViews(net.actor_path)(), HostViews(net.critic_path)()
        host_obs = obs.numpy()
        numpy_s = per_call(
            lambda: (numpy_mlp(host_obs, actor, tanh=True), numpy_mlp(host_obs, critic, tanh=True)),
            n=2000,
        )
        if numpy_s < forward_s:
            forward_s, forward_kind = numpy_s, "numpy"
    # rlstore's collect loop alone, on the same shape
    import tempfile

    from rlstore import algos
    from rlstore.algos._on_policy import build_actor_critic, collect_rollout

    with tempfile.TemporaryDirectory() as logdir:
        overrides = dict(
            logdir=logdir,
            device=device_name,
            progress=False,
            track_tensorboard=False,
            num_envs=num_envs,
        )
        cfg = resolve("ppo", env, overrides)[0]
        run = Run(cfg, "ppo")
        agent, storage, state = build_actor_critic(cfg, algos.get("ppo"), run.device)
        for _ in range(3):
            collect_rollout(agent, storage, state, run)
            storage.after_update()
        start = time.perf_counter()
        rollouts = max(2, 40 * 512 // cfg.rollout_size // (8 if is_atari_id(env) else 1))
        for _ in range(rollouts):
            collect_rollout(agent, storage, state, run)
            storage.after_update()
        collect_s = (time.perf_counter() - start) / (rollouts * cfg.num_steps)
        state.envs.close()
    return {
        "env": type(envs).__name__,
        "num_envs": num_envs,
        "env_step_us": env_s * 1e6,
        "forward_us": forward_s * 1e6,
        "forward_kind": forward_kind,
        "collect_step_us": collect_s * 1e6,
        "collect_fraction_of_floor": (env_s + forward_s) / collect_s,
    }


OFF_POLICY = ("sac", "td3", "ddpg")


def offpolicy_step_products(
    algo: str,
    obs_dim: int,
    action_dim: int,
    hidden=(256, 256),
    batch: int = 256,
    policy_frequency: int = 2,
) -> list[tuple[int, int, int, float]]:
    """The matrix products of one gradient step as CleanRL's algorithm computes them, each
    (m, k, n, how many per gradient step, averaged over the policy delay): forward passes,
    weight gradients, and input gradients where the backward pass needs them (not into
    the data)."""

    def forward(dims):
        return [(batch, a, b) for a, b in zip(dims, dims[1:], strict=False)]

    def backward(dims, weights=True, into_input=False):
        out = []
        for i, (a, b) in enumerate(zip(dims, dims[1:], strict=False)):
            if weights:
                out.append((a, batch, b))  # dW = X^T dY
            if i > 0 or into_input:
                out.append((batch, b, a))  # dX = dY W
        return out

    actor = [obs_dim, *hidden, 2 * action_dim if algo == "sac" else action_dim]
    q = [obs_dim + action_dim, *hidden, 1]
    count = 1 if algo == "ddpg" else 2  # critics
    every_step = forward(actor) + count * forward(q)  # the target action at s', target critics
    every_step += count * (forward(q) + backward(q))  # the critics' step
    if algo == "sac":  # per gradient step, one actor step through both critics on average,
        # and the entropy coefficient's actor pass
        every_step += (
            forward(actor) + 2 * forward(q) + 2 * backward(q, weights=False, into_input=True)
        )
        every_step += backward(actor) + forward(actor)
        delayed = []
    else:  # the actor through Q1, every policy_frequency-th step
        delayed = forward(actor) + forward(q) + backward(q, weights=False, into_input=True)
        delayed += backward(actor)
    return [(*p, 1.0) for p in every_step] + [(*p, 1.0 / policy_frequency) for p in delayed]


def offpolicy_step_flops(
    algo: str,
    obs_dim: int,
    action_dim: int,
    hidden=(256, 256),
    batch: int = 256,
    policy_frequency: int = 2,
) -> float:
    """FLOPs of the matrix products of one gradient step (offpolicy_step_products)."""
    products = offpolicy_step_products(algo, obs_dim, action_dim, hidden, batch, policy_frequency)
    return sum(2.0 * m * k * n * times for m, k, n, times in products)


def child_offpolicy_floor(algo: str, env: str, threads: int) -> dict:
    """The update's floor: one gradient step's FLOPs at the measured rate of torch's
    256 x 256 x 256 matrix product with `threads` threads; and the time of the step's own
    products run bare, one after another (no autograd, no other ops), which is as close to
    the floor as a step made of separate products can come."""
    import gymnasium as gym
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    probe = gym.make(env)
    obs_dim = int(np.prod(probe.observation_space.shape))
    action_dim = int(np.prod(probe.action_space.shape))
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    products = offpolicy_step_products(algo, obs_dim, action_dim)
    groups = {}  # how many per gradient step -> the operands of those products
    for m, k, n, times in products:
        groups.setdefault(times, []).append((torch.randn(m, k), torch.randn(k, n)))

    for _ in range(50):  # warm up
        a @ b
        for x, y in (pair for operands in groups.values() for pair in operands):
            x @ y
    cube_s, bare_s = [], []
    for _ in range(5):  # alternating, so that machine noise hits both
        start = time.perf_counter()
        for _ in range(400):
            a @ b
        cube_s.append((time.perf_counter() - start) / 400)
        seconds = 0.0
        for times, operands in groups.items():
            start = time.perf_counter()
            for _ in range(20):
                for x, y in operands:
                    x @ y
            seconds += times * (time.perf_counter() - start) / 20
        bare_s.append(seconds)
    rate = 2 * 256**3 / statistics.median(cube_s)
    flops = offpolicy_step_flops(algo, obs_dim, action_dim)
    return {
        "algo": algo,
        "threads": threads,
        "gflops_per_s": rate / 1e9,
        "step_gflop": flops / 1e9,
        "floor_sps": rate / flops,
        "bare_products_sps": 1.0 / statistics.median(bare_s),
    }


def child_main(spec: dict) -> None:
    wait_policy = os.environ.get("OMP_WAIT_POLICY", "unset")  # as torch will read it
    kind = spec.pop("kind")
    if kind == "floor":
        out = child_floor(**spec)
    elif kind == "offpolicy_floor":
        out = child_offpolicy_floor(**spec)
    elif kind == "rlstore":
        out = child_rlstore(**spec)
    else:
        out = child_sb3(**spec)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["omp_wait_policy"] = wait_policy
    print("RESULT " + json.dumps(out), flush=True)


# -- parallel mode -----------------------------------------------------------------------------

SUMMARY = re.compile(r": ([\d,]+) steps in ([\d.]+) s \(([\d,]+) steps/s\)")


def run_parallel(k: int, algo: str, steps: int, extra: list[str], env: str = "CartPole-v1") -> dict:
    """K copies of one `rlstore train` command at once; each one's steps/s from its summary."""
    with tempfile.TemporaryDirectory() as logdir:
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rlstore",
                    "train",
                    algo,
                    "--env",
                    env,
                    "--total-timesteps",
                    str(steps),
                    "--seed",
                    str(seed),
                    "--no-progress",
                    "--checkpoint-every",
                    "0",
                    "--logdir",
                    logdir,
                    *extra,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=USER_ENV,
            )
            for seed in range(1, k + 1)
        ]
        outputs = [proc.communicate(timeout=7200) for proc in procs]
        wall = time.perf_counter() - start
    per_run = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        match = SUMMARY.search(out)
        if proc.returncode != 0 or match is None:
            raise RuntimeError(f"a copy failed ({proc.returncode}):\n{err[-2000:]}")
        per_run.append(float(match.group(3).replace(",", "")))
    return {"k": k, "sps": per_run, "aggregate_sps": sum(per_run), "wall_s": wall}


def parallel_main(args: argparse.Namespace) -> None:
    results = []
    for k in args.parallel:
        result = run_parallel(
            k, args.parallel_algo, args.parallel_steps, args.extra, args.parallel_env
        )
        results.append(result)
        print(
            f"K = {k}: aggregate {result['aggregate_sps']:,.0f} steps/s "
            f"(each: {', '.join(f'{s:,.0f}' for s in result['sps'])}), "
            f"wall {result['wall_s']:.1f} s",
            flush=True,
        )
    base = next((r["aggregate_sps"] for r in results if r["k"] == 1), None)
    command = " ".join(
        [
            "python scripts/benchmark.py --parallel",
            *map(str, args.parallel),
            "--parallel-algo",
            args.parallel_algo,
            "--parallel-env",
            args.parallel_env,
            "--parallel-steps",
            str(args.parallel_steps),
            *(["--extra", *args.extra] if args.extra else []),
        ]
    )
    lines = [
        f"# Runs sharing the machine: {args.parallel_algo} on {args.parallel_env}",
        "",
        f"`{command}` on {_machine_name()} ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d')}: K copies of `rlstore train {args.parallel_algo} --env "
        f"{args.parallel_env} --total-timesteps {args.parallel_steps}` at once, default threads "
        f"unless --extra sets them; OMP_WAIT_POLICY "
        f"{USER_ENV.get('OMP_WAIT_POLICY', 'not set (so rlstore sets PASSIVE)')}.",
        "",
        "| K | aggregate steps/s | vs K = 1 | each copy's steps/s | wall s |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"x{r['aggregate_sps'] / base:.2f}" if base else "-"
        each = ", ".join(f"{s:,.0f}" for s in r["sps"])
        lines.append(
            f"| {r['k']} | {r['aggregate_sps']:,.0f} | {ratio} | {each} | {r['wall_s']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"runs": results}, indent=2) + "\n")


# -- parent ------------------------------------------------------------------------------------


def launch(**spec) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        env=USER_ENV,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"child {spec} failed:\n{proc.stderr[-3000:]}")


def fmt(x, spec=",.0f"):
    return "-" if x is None else format(x, spec)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--algos",
        nargs="+",
        default=["ppo", "a2c", "dqn"],
        choices=["ppo", "a2c", "dqn", "sac", "td3", "ddpg", "ppo_lstm"],
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--ppo-steps", type=int, default=250_000)
    parser.add_argument("--dqn-steps", type=int, default=300_000)
    parser.add_argument("--lstm-steps", type=int, default=10_000, help="ppo_lstm")
    parser.add_argument("--offpolicy-steps", type=int, default=6_000, help="SAC, TD3, DDPG")
    parser.add_argument(
        "--offpolicy-starts", type=int, default=1_000, help="SAC's, TD3's, DDPG's learning_starts"
    )
    parser.add_argument(
        "--out",
        help="default results/benchmark, or results/parallel-latest with --parallel",
    )
    parser.add_argument("--parallel", nargs="+", type=int, metavar="K", help="copies at once")
    parser.add_argument(
        "--parallel-algo", default="ppo", choices=["ppo", "a2c", "dqn", "sac", "td3", "ddpg"]
    )
    parser.add_argument("--parallel-steps", type=int, default=50_000)
    parser.add_argument("--parallel-env", default="CartPole-v1", help="the env of --parallel")
    parser.add_argument(
        "--extra", nargs=argparse.REMAINDER, default=[], help="more flags for each copy"
    )
    parser.add_argument(
        "--rlstore-config",
        nargs="+",
        default=[],
        metavar="ALGO=FILE",
        help="run rlstore's ALGO with --config FILE (e.g. a fast preset)",
    )
    parser.add_argument("--no-sb3", action="store_true", help="rlstore runs only")
    parser.add_argument(
        "--default-threads",
        action="store_true",
        help="each trainer at its own default thread count, as users run them",
    )
    parser.add_argument("--env", default="CartPole-v1", help="for PPO: e.g. HalfCheetah-v4")
    parser.add_argument("--device", default="cpu", help="cpu or cuda, for both trainers")
    parser.add_argument(
        "--ppo-envs",
        type=int,
        help="PPO envs on CartPole-v1 (default 4; a large native batch: e.g. 1024) or an "
        "Atari id (default 8, the preset's)",
    )
    args = parser.parse_args()
    from rlstore.presets import resolve

    offpolicy = [a for a in args.algos if a in OFF_POLICY]
    if "ppo_lstm" in args.algos:
        if args.algos != ["ppo_lstm"]:
            parser.error("--algos ppo_lstm goes alone")
        if args.env == "CartPole-v1":  # the fully observed env needs no memory
            args.env = "CartPoleNoVel-v1"
    if offpolicy and (offpolicy != args.algos or args.env == "CartPole-v1"):
        parser.error("--algos sac td3 ddpg go alone, with a continuous-action --env")
    if args.ppo_envs and args.env != "CartPole-v1" and not is_atari_id(args.env):
        parser.error("--ppo-envs applies to CartPole-v1 and Atari ids")
    default_envs = 4 if args.env == "CartPole-v1" else resolve("ppo", args.env)[0].num_envs
    if offpolicy or args.algos == ["ppo_lstm"]:
        default_envs = 1  # unused: these runs take their envs from their settings
    asked_envs = args.ppo_envs
    args.ppo_envs = asked_envs or default_envs
    if args.parallel:
        args.out = args.out or "results/parallel-latest"
        parallel_main(args)
        return
    args.out = args.out or "results/benchmark"

    configs = dict(item.split("=", 1) for item in args.rlstore_config)
    trainers = ("rlstore",) if args.no_sb3 else ("rlstore", "sb3")
    runs = []
    for algo in args.algos:
        steps = {
            "dqn": args.dqn_steps,
            "ppo_lstm": args.lstm_steps,
            **dict.fromkeys(OFF_POLICY, args.offpolicy_steps),
        }
        steps = steps.get(algo, args.ppo_steps)
        for seed in args.seeds:
            for trainer in trainers:  # alternate, so machine noise hits both
                spec = dict(
                    kind=trainer,
                    algo=algo,
                    seed=seed,
                    steps=steps,
                    launch=time.time(),
                    device=args.device,
                    ppo_envs=args.ppo_envs,
                    env=args.env,
                    one_thread=not args.default_threads,
                )
                if algo in OFF_POLICY:
                    spec["offpolicy_starts"] = args.offpolicy_starts
                if trainer == "rlstore":  # the preset's or the config file's envs, unless asked
                    spec.update(config=configs.get(algo, ""), ppo_envs=asked_envs)
                result = launch(**spec)
                result.update(trainer=trainer, algo=algo, seed=seed, steps=steps)
                runs.append(result)
                print(
                    f"{trainer:8s} {algo} seed {seed}: {result['sps']:,.0f} steps/s, "
                    f"475 after {fmt(result['to_475_s'], '.1f')} s, "
                    f"peak RSS {result['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    if offpolicy:
        offpolicy_main(args, runs, trainers)
        return
    lstm = args.algos == ["ppo_lstm"]  # no floor for it
    if not lstm:
        floor = launch(kind="floor", device_name=args.device, num_envs=args.ppo_envs, env=args.env)

    lines = [
        f"# Benchmark: rlstore on {args.env}"
        if args.no_sb3
        else f"# Benchmark: rlstore vs stable-baselines3 on {args.env}",
        "",
        f"`python scripts/benchmark.py --algos {' '.join(args.algos)} --seeds "
        f"{' '.join(map(str, args.seeds))} "
        + (
            f"--lstm-steps {args.lstm_steps}"
            if lstm
            else f"--ppo-steps {args.ppo_steps} --dqn-steps {args.dqn_steps}"
        )
        + (
            " --rlstore-config " + " ".join(f"{a}={f}" for a, f in configs.items())
            if configs
            else ""
        )
        + (" --no-sb3" if args.no_sb3 else "")
        + (f" --device {args.device}" if args.device != "cpu" else "")
        + (f" --ppo-envs {asked_envs}" if asked_envs else "")
        + (f" --env {args.env}" if args.env not in ("CartPole-v1", "CartPoleNoVel-v1") else "")
        + (" --default-threads" if args.default_threads else "")
        + f"` on {_machine_name()}, {time.strftime('%Y-%m-%d')}; each run a "
        + (
            "process at its trainer's default threads (rlstore: 1; SB3: torch's, one per core)"
            if args.default_threads
            else "single-threaded process"
        )
        + ", the trainers alternating.",
        "",
        "| trainer | algo | seed | steps | steps/s | s from launch to 475 | peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['trainer']} | {r['algo']} | {r['seed']} | {r['steps']:,} | "
            f"{r['sps']:,.0f} | {fmt(r['to_475_s'], '.1f')} | {r['peak_rss_mb']:.0f} |"
        )
    lines += ["", "Medians and ratios (rlstore / SB3):", ""]
    summary = {}
    for algo in args.algos:

        def med(trainer, key, algo=algo):
            values = [
                r[key]
                for r in runs
                if r["algo"] == algo and r["trainer"] == trainer and r[key] is not None
            ]
            return statistics.median(values) if values else None

        if args.no_sb3:
            t_ours = med("rlstore", "to_475_s")
            lines.append(
                f"- {algo}: median {fmt(med('rlstore', 'sps'))} steps/s, "
                f"to 475 {fmt(t_ours, '.1f')} s from launch"
            )
            continue
        ours, theirs = med("rlstore", "sps"), med("sb3", "sps")
        t_ours, t_theirs = med("rlstore", "to_475_s"), med("sb3", "to_475_s")
        summary[algo] = {"sps": [ours, theirs], "to_475_s": [t_ours, t_theirs]}
        speed = ours / theirs if ours and theirs else None
        time_ratio = t_ours / t_theirs if t_ours and t_theirs else None
        lines.append(
            f"- {algo}: {fmt(ours)} vs {fmt(theirs)} steps/s (x{fmt(speed, '.2f')}); "
            f"to 475: {fmt(t_ours, '.1f')} s vs {fmt(t_theirs, '.1f')} s "
            f"(ratio {fmt(time_ratio, '.2f')})"
        )
    if lstm:
        floor = None
    else:
        lines += [
            "",
            f"Floor of the PPO batch shape ({floor['num_envs']} {args.env} envs in "
            f"{floor['env']}, policy on {args.device}): env step {floor['env_step_us']:.0f} us "
            f"+ policy forward {floor['forward_us']:.0f} us (the cheaper of a torch and a numpy "
            f"forward: {floor.get('forward_kind', 'torch')}); rlstore's collect loop "
            f"{floor['collect_step_us']:.0f} us per vector step = "
            f"{floor['collect_fraction_of_floor']:.0%} of the floor's throughput.",
        ]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps({"runs": runs, "floor": floor, "summary": summary}, indent=2) + "\n"
    )


def offpolicy_main(args: argparse.Namespace, runs: list[dict], trainers: tuple) -> None:
    """The SAC, TD3 and DDPG report: the runs, the ratios to SB3, and each algorithm's
    steps/s as a fraction of its update's floor at the threads the runs used."""
    threads = 1 if not args.default_threads else available_threads()
    floors = {
        a: launch(kind="offpolicy_floor", algo=a, env=args.env, threads=threads) for a in args.algos
    }
    names = [a.upper() for a in args.algos]
    names = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
    lines = [
        f"# Benchmark: rlstore vs stable-baselines3, {names} on {args.env}",
        "",
        f"`python scripts/benchmark.py --algos {' '.join(args.algos)} --env {args.env} "
        f"--seeds {' '.join(map(str, args.seeds))} --offpolicy-steps {args.offpolicy_steps} "
        f"--offpolicy-starts {args.offpolicy_starts}"
        + (" --default-threads" if args.default_threads else "")
        + f"` on {_machine_name()}, {time.strftime('%Y-%m-%d')}; each run a process "
        + (
            f"at its trainer's default threads (rlstore's --torch-threads auto: 1 for these "
            f"MLPs; SB3: torch's, {threads} here; the floor at {threads})"
            if args.default_threads
            else "with one thread"
        )
        + f", the trainers alternating; {args.offpolicy_steps - args.offpolicy_starts:,} of "
        f"the {args.offpolicy_steps:,} steps take a gradient step.",
        "",
        "| trainer | algo | seed | steps | steps/s | peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['trainer']} | {r['algo']} | {r['seed']} | {r['steps']:,} | "
            f"{r['sps']:,.1f} | {r['peak_rss_mb']:.0f} |"
        )
    lines += ["", "Medians, ratios (rlstore / SB3) and the floor:", ""]
    summary = {}
    for algo in args.algos:
        med = {
            t: statistics.median(r["sps"] for r in runs if r["algo"] == algo and r["trainer"] == t)
            for t in trainers
        }
        floor = floors[algo]
        # the steps/s a run would reach if every gradient step ran at the floor, with the
        # random-action steps before learning starts counted as free
        learning = args.offpolicy_steps - args.offpolicy_starts
        floor_run_sps = args.offpolicy_steps / (learning / floor["floor_sps"])
        ours = med["rlstore"]
        summary[algo] = {**med, "floor": floor, "floor_run_sps": floor_run_sps}
        ratio = f" vs SB3 {med['sb3']:,.1f} (x{ours / med['sb3']:.2f})" if "sb3" in med else ""
        lines.append(
            f"- {algo}: rlstore {ours:,.1f} steps/s{ratio}; floor: "
            f"{floor['step_gflop'] * 1e3:,.0f} MFLOP per gradient step at "
            f"{floor['gflops_per_s']:.0f} GFLOP/s ({floor['threads']} thread(s)) = "
            f"{floor['floor_sps']:,.0f} gradient steps/s, {floor_run_sps:,.0f} steps/s for "
            f"this run; rlstore at {ours / floor_run_sps:.0%} of it"
            + (f", SB3 at {med['sb3'] / floor_run_sps:.0%}" if "sb3" in med else "")
            + f"; the step's bare products alone at "
            f"{floor['bare_products_sps'] / floor['floor_sps']:.0%}"
        )
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps({"runs": runs, "summary": summary}, indent=2) + "\n"
    )


def available_threads() -> int:
    """torch's default thread count in a fresh process (one per core)."""
    import torch

    return torch.get_num_threads()


def _machine_name() -> str:
    """The machine, as results pages name it (rlstore imported only here: importing it sets
    OMP_WAIT_POLICY in this process, which the comparator's children must not inherit)."""
    from rlstore.machine import machine_name

    return machine_name()


if __name__ == "__main__":
    main()
