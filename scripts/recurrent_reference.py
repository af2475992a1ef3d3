"""The reference for the recurrent suite's CartPoleNoVel-v1 row: sb3-contrib's RecurrentPPO
at RL Zoo's tuned ppo_lstm settings (the model card's normalize: True), on rlstore's
CartPoleNoVel-v1, one process per seed at one thread, with the zoo's rollouts (32 steps,
20 epochs on one batch of 256) or, with --rollout preset, rlstore's preset's (128 steps,
minibatches of 256, 10 epochs). Per seed: the mean of the last 100 training episodes, and
the first step where the mean of 100 consecutive ones reached 450.

    pip install -e ".[bench]"
    python scripts/recurrent_reference.py --seeds 1 2 3 --steps 100000 --out ref.json
    python scripts/recurrent_reference.py --rollout preset --steps 200000 --out ref.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

ROLLOUTS = {"zoo": {"n_steps": 32, "n_epochs": 20}, "preset": {"n_steps": 128, "n_epochs": 10}}


def child(seed: int, steps: int, rollout: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from benchmark import sb3_recurrent_ppo  # this script's directory
    from stable_baselines3.common.callbacks import BaseCallback

    from rlstore.suite_results import first_reach

    returns: list[float] = []
    ends: list[int] = []

    class Watch(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    returns.append(info["episode"]["r"])
                    ends.append(self.num_timesteps)
            return True

    model = sb3_recurrent_ppo("CartPoleNoVel-v1", seed, **ROLLOUTS[rollout])
    model.learn(steps, callback=Watch())
    reached = first_reach(returns, ends, 450, window=100)
    last_100 = statistics.fmean(returns[-100:])
    return {
        "seed": seed,
        "steps": steps,
        "rollout": rollout,
        "last_100_mean": last_100,
        "reached_450_at": reached,
    }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--out", default="recurrent-reference.json")
    parser.add_argument("--rollout", choices=sorted(ROLLOUTS), default="zoo")
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        command = [sys.executable, __file__, "--child", str(seed), str(args.steps), args.rollout]
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[7:]))
        run = results[-1]
        print(
            f"seed {seed}: last-100 mean {run['last_100_mean']:.1f}, the mean of 100 reached "
            f"450 at {run['reached_450_at']}",
            flush=True,
        )
    scores = [r["last_100_mean"] for r in results]
    print(f"mean over seeds {statistics.fmean(scores):.1f}")
    with open(args.out, "w") as f:
        json.dump({"runs": results}, f, indent=2)


if __name__ == "__main__":
    main()
