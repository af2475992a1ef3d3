"""The ONNX file of `rlstore export` against `rlstore.load_policy`, for every algorithm at
its default network on its default env: the largest difference between their actions (and
values) on 1,000 observations drawn from the observation space, and the time per call of
each, one observation and a batch of 64, at default threads (onnxruntime's and torch's own),
as a user calls them.

    pip install -e ".[export]"
    python scripts/benchmark_export.py                 # all algorithms
    python scripts/benchmark_export.py --algos ppo sac

Each algorithm trains a short run first (one rollout, or a few hundred steps of updates):
the weights are trained ones, not the initialization. Writes results/export.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime

import rlstore
from rlstore import algos
from rlstore.evaluate import make_eval_envs
from rlstore.export import export
from rlstore.presets import resolve

ROOT = Path(__file__).resolve().parent.parent
ENVS = {
    "ppo_lstm": "CartPoleNoVel-v1",
    **dict.fromkeys(("sac", "td3", "ddpg", "tqc", "crossq"), "Pendulum-v1"),
}
ON_POLICY, VALUE_METHODS = ["ppo", "a2c", "ppo_lstm"], ["dqn", "c51", "qrdqn", "rainbow", "pqn"]
ALGOS = ON_POLICY + VALUE_METHODS + ["sac", "td3", "ddpg", "tqc", "crossq"]
OBSERVATIONS = 1000


def train_short(algo: str, env_id: str, logdir: str) -> Path:
    overrides = {"env_id": env_id, "logdir": logdir, "progress": False, "device": "cpu"}
    cfg, _ = resolve(algo, env_id, overrides)
    if hasattr(cfg, "learning_starts"):
        overrides |= {"learning_starts": 200, "total_timesteps": 200 + 100 * cfg.num_envs}
    else:
        overrides["total_timesteps"] = cfg.rollout_size
    cfg, preset = resolve(algo, env_id, overrides)
    return algos.get(algo).train(cfg, preset).run_dir


def per_call(fn, calls: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean seconds per call of `calls` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure(algo: str, env_id: str, logdir: str) -> dict:
    run_dir = train_short(algo, env_id, logdir)
    path = export(run_dir, "onnx", values=True)
    policy = rlstore.load_policy(run_dir)
    session = onnxruntime.InferenceSession(str(path))
    envs = make_eval_envs(env_id, policy.config, 1)
    envs.observation_space.seed(0)
    obs = np.concatenate([envs.observation_space.sample() for _ in range(OBSERVATIONS)])
    envs.close()
    feeds = {"obs": obs.astype(np.float32)}
    if policy.recurrent:  # every row an episode's first step, as load_policy's fresh state
        feeds["state"] = np.zeros((OBSERVATIONS, *policy.network.state_shape), np.float32)
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    policy.reset()
    actions = policy(obs)
    policy.reset()
    values = policy.q_values(obs) if policy.greedy or policy.action_critic else policy.value(obs)
    continuous = bool(policy.info.get("continuous"))
    action_gap = np.abs(outputs["action"].astype(np.float64) - actions).max()
    value_gap = np.abs(outputs["q_values" if "q_values" in outputs else "value"] - values).max()

    plain = export(run_dir, "onnx", out=Path(logdir) / f"{algo}-actions.onnx")
    actions_only = onnxruntime.InferenceSession(str(plain))
    timings = {}
    for batch in (1, 64):
        rows = {name: value[:batch] for name, value in feeds.items()}
        calls = 2000 if batch == 1 else 500
        timings[str(batch)] = {
            "load_policy": per_call(lambda: policy(obs[:batch]), calls),  # noqa: B023
            "onnx": per_call(lambda: actions_only.run(["action"], rows), calls),  # noqa: B023
        }
    return {
        "algo": algo,
        "env": env_id,
        "continuous": continuous,
        "actions_differ": int((outputs["action"] != actions).sum()) if not continuous else None,
        "max_action_difference": float(action_gap),
        "max_value_difference": float(value_gap),
        "seconds_per_call": timings,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| algorithm | env | largest action difference | largest value difference | "
        "load_policy, 1 obs | ONNX, 1 obs | x | load_policy, 64 obs | ONNX, 64 obs | x |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        t1, t64 = r["seconds_per_call"]["1"], r["seconds_per_call"]["64"]
        gap = (
            f"{r['max_action_difference']:.1e}"
            if r["continuous"]
            else f"0 (equal: {OBSERVATIONS - r['actions_differ']}/{OBSERVATIONS})"
        )
        lines.append(
            f"| {r['algo']} | {r['env']} | {gap} | {r['max_value_difference']:.1e} | "
            f"{t1['load_policy'] * 1e6:.0f} us | {t1['onnx'] * 1e6:.0f} us | "
            f"x{t1['load_policy'] / t1['onnx']:.1f} | {t64['load_policy'] * 1e6:.0f} us | "
            f"{t64['onnx'] * 1e6:.0f} us | x{t64['load_policy'] / t64['onnx']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=ALGOS)
    parser.add_argument("--out", default=str(ROOT / "results" / "export"))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as logdir:
        for algo in args.algos:
            result = measure(algo, ENVS.get(algo, "CartPole-v1"), logdir)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
    text = "\n".join(
        [
            "# rlstore export: the ONNX file against load_policy",
            "",
            "Written by `python scripts/benchmark_export.py` (every algorithm at its default "
            "network on its default env, after a short run; 1,000 observations drawn from the "
            "observation space; time per call at default threads, the median of 5 repeats; "
            "the ONNX file timed without `--values`, as load_policy's call gives actions only).",
            "",
            table(results),
            "",
        ]
    )
    Path(f"{args.out}.md").write_text(text)
    Path(f"{args.out}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}.md and .json")


if __name__ == "__main__":
    main()
