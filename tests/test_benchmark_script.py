"""scripts/benchmark.py runs each comparator as its users run it; the other scripts' smoke
tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from extras import needs

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark.py"

PROBE = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("benchmark", {str(SCRIPT)!r})
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)
import rlstore  # sets OMP_WAIT_POLICY=PASSIVE in this process, as the script's main() does
import os
assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
out = benchmark.launch(kind="offpolicy_floor", algo="td3", env="Pendulum-v1", threads=1)
print(out["omp_wait_policy"])
"""


def test_children_get_the_environment_the_script_started_with():
    """rlstore's OMP_WAIT_POLICY=PASSIVE in the script's own process must not reach the
    children (SB3's ran at half speed at two threads under it): a child sees the policy the
    script was started with, here none."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["unset"]


def test_the_offpolicy_floor_counts_each_algorithms_matrix_products_by_hand():
    """One gradient step's multiply-adds, 3-d observations, 1-d actions, 4-4 networks,
    batch 1, the actor at every 2nd step. Actor 3-4-4-1: 12 + 16 + 4 = 32 (first layer 12);
    SAC's 3-4-4-2: 36; a critic 4-4-4-1: 36 (first layer 16)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark", SCRIPT)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    # target (actor + critics at s') + critics (forward, weight and input gradients but
    # the first layer's) + the actor step (actor, critic, critic's input gradient, actor's
    # weight and input gradients but the first layer's) / 2
    td3 = (32 + 2 * 36) + 2 * (36 + 36 + 20) + (32 + 36 + 36 + 32 + 20) / 2
    ddpg = (32 + 36) + (36 + 36 + 20) + (32 + 36 + 36 + 32 + 20) / 2  # one critic
    # SAC: its actor step goes through both critics, every step, plus the entropy pass
    sac = (36 + 2 * 36) + 2 * (36 + 36 + 20) + (36 + 72 + 72 + 36 + 24) + 36
    for algo, macs in (("td3", td3), ("ddpg", ddpg), ("sac", sac)):
        flops = benchmark.offpolicy_step_flops(algo, 3, 1, hidden=(4, 4), batch=1)
        assert flops == 2 * macs, algo


def test_the_step_profile_times_each_algorithms_step_and_groups_its_ops():
    """scripts/offpolicy_step_profile.py: SAC's and TD3's real gradient steps, timed and
    profiled; the matrix products are a group of their own and take time."""
    import importlib.util

    path = SCRIPT.parent / "offpolicy_step_profile.py"
    spec = importlib.util.spec_from_file_location("offpolicy_step_profile", path)
    profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile)
    for algo in ["sac", "td3"]:
        step = profile.step_function(algo, compiled=False)
        assert profile.time_step(step, blocks=1, steps=2) > 0
        groups = profile.profile_step(step, steps=2)
        assert groups["matrix products"] > 0 and groups["ReLU forward"] > 0


@needs("bench", "stable_baselines3")
def test_the_sb3_td3_curve_writes_each_episode_and_sums_them_by_window(tmp_path):
    curve = _load_script("sb3_td3_curve")
    out = tmp_path / "curve.jsonl"
    curve.train("Pendulum-v1", seed=1, steps=600, out=out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [200, 400, 600]  # Pendulum's 200-step episodes
    assert curve.summary(out, window=400) == (  # windows [0, 400) and [400, 800)
        f"0k: {rows[0]['return']:.0f} (200 steps), "
        f"0k: {(rows[1]['return'] + rows[2]['return']) / 2:.0f} (200 steps)"
    )


@needs("bench", "stable_baselines3")
def test_the_sb3_td3_curve_continues_from_its_newest_checkpoint(tmp_path):
    """A run stopped at 400 steps and started again with the same command goes on from its
    400-step checkpoint to 600: episodes after the checkpoint are dropped, not repeated; the
    replay buffer comes back with the model (600 transitions, not 200); older checkpoints go."""
    import pickle

    curve = _load_script("sb3_td3_curve")
    out = tmp_path / "curve.jsonl"
    curve.train(
        "Pendulum-v1", seed=1, steps=400, out=out, checkpoint_every=200, learning_starts=100
    )
    with out.open("a") as file:  # an episode the stopped run logged after its checkpoint
        file.write(json.dumps({"step": 450, "return": 0.0, "length": 50}) + "\n")
    folder = tmp_path / "curve.jsonl.checkpoints"
    assert [p.name for p in folder.iterdir()] == ["step_000000400"]
    curve.train(
        "Pendulum-v1", seed=1, steps=600, out=out, checkpoint_every=200, learning_starts=100
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [200, 400, 600]
    assert [p.name for p in folder.iterdir()] == ["step_000000600"]
    with (folder / "step_000000600" / "replay.pkl").open("rb") as file:
        assert pickle.load(file).size() == 600
    assert curve.newest_checkpoint(tmp_path / "none") is None


def _load_script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_env_dynamics_finds_the_step_where_two_installs_part(tmp_path):
    """Two recordings of the same env in one install are equal; a recording whose
    observations were moved by 0.05 from step 3 of episode 1 on (as another physics would)
    is reported from that step, with the gap before it (0) and at it; one that ended sooner
    with the same steps, as equal until then. Each recording is written to the name given."""
    dynamics = _load_script("env_dynamics")
    first, second, moved = tmp_path / "a.npz", tmp_path / "b.rec", tmp_path / "c.npz"
    dynamics.record("Pendulum-v1", first, episodes=2, max_steps=10)
    dynamics.record("Pendulum-v1", second, episodes=2, max_steps=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npz", "b.rec"]
    arrays = dict(np.load(second))
    arrays["obs1"] = arrays["obs1"].copy()
    arrays["obs1"][3:, 2] += 0.05
    np.savez(moved, **arrays)
    header, *same = dynamics.compare(first, second).splitlines()
    assert header.startswith("Pendulum-v1: gymnasium ")
    assert [line.split(" (")[0] for line in same] == [
        "episode 0: equal to 0e+00",
        "episode 1: equal to 0e+00",
    ]
    arrays["obs0"], arrays["rew0"] = arrays["obs0"][:7], arrays["rew0"][:6]  # ended at 6
    np.savez(moved, **arrays)
    lines = dynamics.compare(first, moved).splitlines()
    assert lines[1].startswith(
        "episode 0: equal to 0e+00 for 6 steps, then one ended (10 vs 6 steps, return "
    )
    assert lines[2].startswith(
        "episode 1: differs from step 3: 0e+00 the step before, "
        "5.0e-02 there, 0.05 at most (10 vs 10 steps, return "
    )


def test_the_comparison_scripts_leave_openmp_alone_until_their_comparators_ran():
    """Loading a script that launches SB3's runs imports no rlstore (importing rlstore sets
    OMP_WAIT_POLICY=PASSIVE in the process, which the SB3 children would inherit: run that
    way, SB3's runs sharing the machine looked four times faster than SB3's users see)."""
    scripts = SCRIPT.parent
    for name in ("benchmark.py", "benchmark_spaces.py", "benchmark_her.py", "eval_cost.py"):
        probe = (
            "import importlib.util, os, sys\n"
            f"spec = importlib.util.spec_from_file_location('s', {str(scripts / name)!r})\n"
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "print('rlstore' in sys.modules, os.environ.get('OMP_WAIT_POLICY'))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        said = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env
        )
        assert said.stdout.split() == ["False", "None"], (name, said.stdout, said.stderr[-500:])
