"""Where a DQN env step's time goes, measured inside a real `rlstore.algos.dqn.train` run.

    python scripts/dqn_budget.py                      # the defaults, 120k steps
    python scripts/dqn_budget.py --steps 60000 -- --n-step 3 --prioritized

The pieces of the loop (env step, replay add and sample, episode statistics, acting, and
the gradient step: numpy's, or torch's TD forward, backward and Adam) are wrapped with
timers in place, so each is timed where it runs, caches and all; micro-benchmarks of the
same calls in isolation read a half to a third of that.
Prints microseconds per env step for each piece and for the whole run. Single-threaded.
With one env, LeanDQNStep takes the env step, the replay add and the episode statistics
in one call (rlstore/lean.py): its line covers them, and the greedy actions inside it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

import torch

from rlstore.algos import dqn
from rlstore.cli import parse_train
from rlstore.episode_stats import EpisodeStats
from rlstore.host_networks import GreedyActor
from rlstore.host_updates import HostDQNStep
from rlstore.lean import LeanDQNStep
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.storage import ReplayBuffer

seconds: defaultdict[str, float] = defaultdict(float)
ONE_ENV_STEP = "one-env step (act, env step, add, statistics)"
GREEDY = "greedy actions (acting)"


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - start

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120_000)
    parser.add_argument("flags", nargs="*", help="more `rlstore train dqn` flags, after --")
    args = parser.parse_args()
    torch.set_num_threads(1)

    LeanSyncVectorEnv.step = timed("env step (sync vector env)", LeanSyncVectorEnv.step)
    ReplayBuffer.add = timed("replay add", ReplayBuffer.add)
    ReplayBuffer.sample = timed("replay sample", ReplayBuffer.sample)
    ReplayBuffer.sample_host = timed("replay sample", ReplayBuffer.sample_host)
    LeanDQNStep.__call__ = timed(ONE_ENV_STEP, LeanDQNStep.__call__)
    EpisodeStats.update = timed("episode statistics", EpisodeStats.update)
    GreedyActor.__call__ = timed(GREEDY, GreedyActor.__call__)
    HostDQNStep.__call__ = timed("gradient step (numpy)", HostDQNStep.__call__)
    dqn.td_loss = timed("TD loss forward", dqn.td_loss)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.optim.Adam.step = timed("Adam step", torch.optim.Adam.step)

    with tempfile.TemporaryDirectory() as logdir:
        flags = ["dqn", "--env", "CartPole-v1", "--total-timesteps", str(args.steps)]
        flags += ["--logdir", logdir, "--no-progress", "--checkpoint-every", "0", *args.flags]
        _, cfg, preset = parse_train(flags)
        result = dqn.train(cfg, preset)

    steps = result.global_step
    print(f"{steps:,} steps, {result.sps:,.0f} steps/s ({1e6 / result.sps:.0f} us per env step)")
    nested = GREEDY if ONE_ENV_STEP in seconds else None  # timed inside the one-env step
    for name, total in sorted(seconds.items(), key=lambda item: -item[1]):
        if name != nested and total / steps > 5e-8:  # (pieces the run did not use: none)
            print(f"  {name:46s} {total / steps * 1e6:6.1f} us per env step")
        if name == ONE_ENV_STEP:
            print(f"    {'of which ' + GREEDY:44s} {seconds[GREEDY] / steps * 1e6:6.1f}")
    rest = result.seconds - sum(t for name, t in seconds.items() if name != nested)
    print(f"  {'the rest (loop, logging)':46s} {rest / steps * 1e6:6.1f} us per env step")


if __name__ == "__main__":
    main()
