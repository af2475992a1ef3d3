"""The reference for the recurrent suite's CartPoleNoVel-v1 row: sb3-contrib's RecurrentPPO
at RL Zoo's tuned ppo_lstm settings (the model card's normalize: True; rollouts of 32
steps, 20 epochs on one batch of 256), on rlstore's CartPoleNoVel-v1, one process per seed
at one thread. Per seed: the mean of the last 100 training episodes.

    pip install -e ".[bench]"
    python scripts/recurrent_reference.py --seeds 1 2 3 --steps 100000 --out ref.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def child(seed: int, steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from benchmark import sb3_recurrent_ppo  # this script's directory
    from stable_baselines3.common.callbacks import BaseCallback

    returns: list[float] = []

    class Watch(BaseCallback):
        def _on_step(self) -> bool:
            returns.extend(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            return True

    model = sb3_recurrent_ppo("CartPoleNoVel-v1", seed, n_steps=32, n_epochs=20)  # the zoo's
    model.learn(steps, callback=Watch())
    return {"seed": seed, "steps": steps, "last_100_mean": statistics.fmean(returns[-100:])}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print("RESULT " + json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--out", default="recurrent-reference.json")
    args = parser.parse_args()
    results = []
    for seed in args.seeds:
        proc = subprocess.run([sys.executable, __file__, "--child", str(seed), str(args.steps)],
                              capture_output=True, text=True, check=True)  # fmt: skip
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        results.append(json.loads(line[7:]))
        print(f"seed {seed}: last-100 mean {results[-1]['last_100_mean']:.1f}", flush=True)
    scores = [r["last_100_mean"] for r in results]
    print(f"mean over seeds {statistics.fmean(scores):.1f}")
    with open(args.out, "w") as f:
        json.dump({"runs": results}, f, indent=2)


if __name__ == "__main__":
    main()
