"""What each fast path of rlstore buys: each timed against the plain version it stands
for, in one process, on the shapes of the default runs. Prints a markdown table (the one in
docs/maintainers/fast-paths.md).

    python scripts/fast_paths.py
    python scripts/fast_paths.py --runs 3   # whole runs: --fast-paths auto against off

Median of 7 repeats of N calls each, one torch thread and one BLAS thread (rlstore's
default). With --runs K: PPO, A2C and DQN on CartPole-v1 at their defaults and presets,
each run as `rlstore train` in its own process at the default threads, the two modes
alternating, K runs of each; the median env steps/s of each and their ratio.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch.distributions import Categorical

from rlstore.host_networks import GreedyActor
from rlstore.host_updates import HostDQNStep, HostPPOStep
from rlstore.lean import LeanRollout
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.networks import ActorCritic, QNetwork, sample_categorical


def per_call_us(fn: Callable[[], object], n: int = 2000) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def ppo_minibatch_step() -> tuple[str, float, float]:
    """A PPO minibatch step of the defaults (128 CartPole transitions): torch vs HostPPOStep."""
    from torch import nn

    from rlstore.algos.ppo import PPOConfig, ppo_loss
    from rlstore.storage import RolloutBatch

    cfg, rng = PPOConfig(), np.random.default_rng(0)
    agent = ActorCritic(4, 2)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
    f32 = lambda *shape: torch.from_numpy(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    batch = RolloutBatch(
        f32(128, 4),
        torch.from_numpy(rng.integers(0, 2, 128)),
        f32(128) - 0.7,
        f32(128),
        f32(128),
        f32(128),
    )

    def torch_step():
        log_prob, entropy, value = agent.evaluate(batch.obs, batch.actions)
        losses = ppo_loss(log_prob, value, entropy, batch, cfg, diagnostics=False)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        nn.utils.clip_grad_norm_(list(agent.parameters()), cfg.max_grad_norm, foreach=True)
        optimizer.step()

    fast = HostPPOStep(agent, optimizer)
    return (
        "HostPPOStep: a PPO minibatch step, 128 CartPole transitions",
        per_call_us(torch_step, n=300),
        per_call_us(lambda: fast(batch, cfg, diagnostics=False), n=300),
    )


def dqn_gradient_step() -> tuple[str, float, float]:
    """A DQN gradient step of the defaults (batch 128, 120-84 Q-network): torch vs
    HostDQNStep."""
    import copy

    from rlstore.algos.dqn import DQNConfig, td_loss
    from rlstore.storage.replay import ReplayBatch

    cfg, rng = DQNConfig(), np.random.default_rng(0)
    q_network = QNetwork(4, 2)
    target = copy.deepcopy(q_network)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=2.5e-4, fused=True)
    f32 = lambda *shape: torch.from_numpy(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    batch = ReplayBatch(
        f32(128, 4),
        torch.from_numpy(rng.integers(0, 2, 128)),
        f32(128),
        f32(128, 4),
        torch.zeros(128, dtype=torch.bool),
        torch.full((128,), 0.99),
        torch.ones(128),
        torch.arange(128),
    )

    def torch_step():
        loss = td_loss(q_network, target, batch, cfg)[0]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    fast = HostDQNStep(q_network, target, optimizer)
    host_batch = ReplayBatch(*(x.numpy() for x in batch))  # as ReplayBuffer.sample_host gives
    fast_us = per_call_us(lambda: fast(host_batch, cfg), n=300)
    return "HostDQNStep: a DQN gradient step, batch 128", per_call_us(torch_step, n=300), fast_us


def collect_step() -> tuple[str, float, float]:
    """A step of PPO's collect loop at the defaults (4 CartPole envs): the loop's own calls
    vs LeanRollout, per vector step over whole rollouts."""
    import tempfile

    from rlstore import algos
    from rlstore.algos._on_policy import build_actor_critic, collect_rollout
    from rlstore.presets import resolve
    from rlstore.run import Run

    supports, per_step = LeanRollout.supports, {}
    with tempfile.TemporaryDirectory() as logdir:
        overrides = dict(logdir=logdir, device="cpu", progress=False, track_tensorboard=False)
        cfg = resolve("ppo", "CartPole-v1", overrides)[0]
        run = Run(cfg, "ppo")
        agent, storage, state = build_actor_critic(cfg, algos.get("ppo"), run.device)

        def rollout():
            collect_rollout(agent, storage, state, run)
            storage.after_update()

        for lean in (False, True):
            LeanRollout.supports = supports if lean else staticmethod(lambda *args: False)
            per_step[lean] = per_call_us(rollout, n=20) / cfg.num_steps
        LeanRollout.supports = supports
        state.envs.close()
    return "LeanRollout: a step of PPO's collect loop, 4 CartPole envs", *per_step.values()


def main() -> None:
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")  # numpy's BLAS too, as a Run sets it
    torch.manual_seed(0)
    rows = []

    agent = ActorCritic(4, 2)
    obs4 = torch.randn(4, 4)
    with torch.inference_mode():
        fast = per_call_us(lambda: (agent.actor_path(obs4), agent.critic_path(obs4)))
        plain = per_call_us(lambda: (agent.actor(obs4), agent.critic(obs4)))
    rows.append(("SequentialRunner: actor + critic forward, 4 x 4 obs", plain, fast))

    logits = torch.randn(4, 2)
    with torch.inference_mode():
        fast = per_call_us(lambda: sample_categorical(logits))

        def plain_sample():
            dist = Categorical(logits=logits)
            action = dist.sample()
            return action, dist.log_prob(action)

        plain = per_call_us(plain_sample)
    rows.append(("sample_categorical: 4 actions and log-probs", plain, fast))

    obs4_host = obs4.numpy()

    def torch_act():
        with torch.inference_mode():
            action, log_prob, value = agent.act(obs4)
        return action.numpy(), log_prob.numpy(), value.numpy()

    host_us = per_call_us(lambda: agent.act_on_host(obs4_host))
    rows.append(
        (
            "HostActorCritic: PPO's act (forward and sampling), 4 host obs",
            per_call_us(torch_act),
            host_us,
        )
    )
    rows.append(collect_step())
    rows.append(ppo_minibatch_step())
    rows.append(dqn_gradient_step())

    q_network = QNetwork(4, 2)
    greedy = GreedyActor(q_network.advantage_path)
    obs1 = np.random.default_rng(0).normal(size=(1, 4)).astype(np.float32)

    def torch_argmax():
        with torch.inference_mode():
            return q_network(torch.from_numpy(obs1)).argmax(-1).numpy()

    rows.append(
        (
            "GreedyActor: DQN's argmax Q, 1 host obs",
            per_call_us(torch_argmax),
            per_call_us(lambda: greedy(obs1)),
        )
    )

    for num_envs in (1, 4):
        env_fns = [lambda: gym.make("CartPole-v1")] * num_envs
        lean, sync = LeanSyncVectorEnv(env_fns), gym.vector.SyncVectorEnv(env_fns)
        lean.reset(seed=0)
        sync.reset(seed=0)
        action = np.zeros(num_envs, dtype=np.int64)
        rows.append(
            (
                f"LeanSyncVectorEnv: one step of {num_envs} CartPole env(s)",
                per_call_us(lambda: sync.step(action)),  # noqa: B023
                per_call_us(lambda: lean.step(action)),  # noqa: B023
            )
        )
    native = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="vector_entry_point")
    native.reset(seed=0)
    native_us = per_call_us(lambda: native.step(np.zeros(4, dtype=np.int64)))

    # Adam's step where the second moments of a 120 x 84 layer (DQN's) decay below the
    # smallest normal float: denormal without flushing, zero with it.
    moment, moment_sq = torch.full((120, 84), 1e-30), torch.full((120, 84), 1e-36)

    def adam_step():
        return moment / ((moment_sq * 1e-3).sqrt() + 1e-8)

    slow = per_call_us(adam_step, n=300)
    torch.set_flush_denormal(True)
    fast = per_call_us(adam_step, n=300)
    torch.set_flush_denormal(False)
    rows.append(("flush_denormals: Adam's m / (sqrt(v) + eps), v decayed to denormal", slow, fast))

    print("| fast path: what is timed | plain, us | fast, us | speed-up |")
    print("|---|---|---|---|")
    for name, plain, fast in rows:
        print(f"| {name} | {plain:.1f} | {fast:.1f} | x{plain / fast:.1f} |")
    print(f"\nGymnasium's native CartPoleVectorEnv, one step of 4 envs: {native_us:.1f} us.")


WHOLE_RUNS = {  # algorithm: its flags for a run of the defaults, cut short
    "ppo": ["--total-timesteps", "50000"],
    "a2c": ["--total-timesteps", "50000"],
    "dqn": ["--total-timesteps", "40000"],
    "sac": ["--total-timesteps", "3000", "--env", "HalfCheetah-v4", "--learning-starts", "1000"],
    "td3": ["--total-timesteps", "3000", "--env", "HalfCheetah-v4", "--learning-starts", "1000"],
}


def whole_runs(repeats: int) -> None:
    """`rlstore train` with --fast-paths auto and off, alternating; medians and ratios."""
    import re
    import subprocess
    import sys
    import tempfile

    sps: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as logdir:
        for algo, flags in WHOLE_RUNS.items():
            for _ in range(repeats):
                for mode in ("auto", "off"):
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "rlstore",
                            "train",
                            algo,
                            *flags,
                            "--fast-paths",
                            mode,
                            "--logdir",
                            logdir,
                            "--no-progress",
                            "--checkpoint-every",
                            "0",
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout
                    found = re.search(r"\(([\d,]+) steps/s\)", out)
                    sps.setdefault((algo, mode), []).append(float(found[1].replace(",", "")))
    print("| algorithm | env | steps | --fast-paths off, steps/s | auto, steps/s | speed-up |")
    print("|---|---|---|---|---|---|")
    for algo, flags in WHOLE_RUNS.items():
        off, auto = (statistics.median(sps[algo, mode]) for mode in ("off", "auto"))
        env = flags[flags.index("--env") + 1] if "--env" in flags else "CartPole-v1"
        print(
            f"| {algo} | {env} | {int(flags[1]):,} | {off:,.0f} | {auto:,.0f} | x{auto / off:.2f} |"
        )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=0, help="whole runs of each mode (K)")
    args = parser.parse_args()
    if args.runs:
        whole_runs(args.runs)
    else:
        main()
