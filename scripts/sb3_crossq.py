"""sb3-contrib's CrossQ at the settings of `rlstore benchmark continuous-methods`' CrossQ
rows (the RL Zoo's crossq presets, configs/crossq/), seeds 1-3, scored as the suite scores
them: per seed the mean of the last 100 training returns, and the first step where the
mean of the last 20 reached the row's threshold.

    pip install -e ".[bench]"
    python scripts/sb3_crossq.py                     # Pendulum-v1; writes results/sb3-crossq.*
    python scripts/sb3_crossq.py --env LunarLanderContinuous-v3    # hours a seed on a CPU

One process, one torch thread (as each suite run), SB3's own env handling (a DummyVecEnv
of one env; time limits bootstrap, as rlstore's).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "sb3-crossq"
# The zoo's presets (hyperparams/crossq.yml) beside sb3-contrib's defaults
SETTINGS = {
    "Pendulum-v1": dict(
        steps=20_000, threshold=-200, policy_delay=2, net_arch=dict(pi=[256, 256], qf=[256, 256])
    ),
    "LunarLanderContinuous-v3": dict(steps=200_000, threshold=200, learning_starts=10_000),
}


def train(env_id: str, seed: int) -> dict:
    import torch
    from sb3_contrib import CrossQ
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    settings = dict(SETTINGS[env_id])
    steps, _ = settings.pop("steps"), settings.pop("threshold")
    net_arch = settings.pop("net_arch", None)
    returns, ends = [], []

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    returns.append(float(info["episode"]["r"]))
                    ends.append(self.num_timesteps)
            return True

    kwargs = {"policy_kwargs": dict(net_arch=net_arch)} if net_arch else {}
    model = CrossQ("MlpPolicy", env_id, seed=seed, device="cpu", **settings, **kwargs)
    model.learn(steps, callback=Episodes())
    return {"seed": seed, "returns": returns, "steps": ends}


def first_reach(returns: list[float], steps: list[int], threshold: float) -> int | None:
    for end in range(20, len(returns) + 1):
        if np.mean(returns[end - 20 : end]) >= threshold:
            return steps[end - 1]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", nargs="+", default=["Pendulum-v1"], choices=list(SETTINGS))
    args = parser.parse_args()
    results = (
        json.loads(OUT.with_suffix(".json").read_text())
        if OUT.with_suffix(".json").exists()
        else {}
    )
    for env_id in args.env:
        runs = [train(env_id, seed) for seed in (1, 2, 3)]
        results[env_id] = {"settings": SETTINGS[env_id], "runs": runs}
        print(env_id, [float(np.mean(r["returns"][-100:])) for r in runs], flush=True)
    OUT.with_suffix(".json").write_text(json.dumps(results) + "\n")
    lines = [
        "# sb3-contrib's CrossQ beside rlstore's (scripts/sb3_crossq.py)",
        "",
        "`python scripts/sb3_crossq.py --env ENV`: sb3-contrib's CrossQ at the RL Zoo's crossq",
        "presets, seeds 1-3, scored as `rlstore benchmark continuous-methods` scores its CrossQ",
        "rows: per seed the mean of the last 100 training returns, and the first step where the",
        "mean of the last 20 met the row's threshold. The data: sb3-crossq.json.",
        "",
        "| env | steps | last 100, per seed | mean +- std | threshold | reached at, per seed |",
        "|---|---|---|---|---|---|",
    ]
    for env_id, result in results.items():
        threshold = result["settings"]["threshold"]
        scores = [float(np.mean(r["returns"][-100:])) for r in result["runs"]]
        reached = [first_reach(r["returns"], r["steps"], threshold) for r in result["runs"]]
        lines.append(
            f"| {env_id} | {result['settings']['steps']:,} | "
            + ", ".join(f"{s:.1f}" for s in scores)
            + f" | {np.mean(scores):.1f} +- {np.std(scores):.1f} | {threshold} | "
            + ", ".join("-" if r is None else f"{r:,}" for r in reached)
            + " |"
        )
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT.with_suffix('.md')}")


if __name__ == "__main__":
    main()
