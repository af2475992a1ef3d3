"""`rlstore benchmark`: runs once, skips what finished, resumes what was interrupted, and
its table equals the same runs made by hand."""

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from extras import needs

from rlstore.cli import BenchmarkArgs, main
from rlstore.errors import UsageError
from rlstore.locks import DirectoryLock
from rlstore.presets import PRESET_DIR
from rlstore.suite import RunProgress, ago, core_hours_left, run_order, still_to_run, suite_part
from rlstore.suite_file import Row, Suite, find_suite, load_suite, preflight, version_satisfies
from rlstore.suite_results import made_where, results_markdown, row_result, run_result, score_text

TINY = """
name = "tiny"
seeds = [1, 2]

[[row]]
algo = "ppo"
env = "CartPole-v1"
steps = 4096
threshold = 30
need = 2
band = [10, 500]
source = "a test"
overrides = { num_steps = 64 }

[[row]]
name = "dqn-short"
algo = "dqn"
env = "CartPole-v1"
steps = 3000
seeds = [3]
band = [400, 500]
source = "a band no 3,000-step run reaches"
overrides = { learning_starts = 500, buffer_size = 1000, q_hidden = [32, 32] }
"""


def summaries(runs: Path) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in runs.glob("*/summary.json")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny suite, run once: (suite file, output dir, exit status, stdout)."""
    root = tmp_path_factory.mktemp("suite")
    suite = root / "tiny.toml"
    suite.write_text(TINY)
    out = root / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlstore",
            "benchmark",
            str(suite),
            "--out",
            str(out),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
    )
    return suite, out, result.returncode, result.stdout


@pytest.mark.slow
def test_suite_runs_every_run_and_a_second_start_does_nothing(tiny, capsys):
    suite, out, code, stdout = tiny
    assert code == 1, stdout  # the dqn row is below its band
    assert "3 runs" in stdout and "3 to start" in stdout
    before = summaries(out / "runs")
    assert len(before) == 3 and len(list((out / "runs").iterdir())) == 3
    assert (out / "results.md").is_file()

    assert main(["benchmark", str(suite), "--out", str(out), "--no-plot"]) == 1
    assert "3 finished, 0 to resume, 0 to start" in capsys.readouterr().out
    assert summaries(out / "runs") == before  # nothing ran again
    assert len(list((out / "runs").iterdir())) == 3


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.slow
def test_status_says_where_each_run_stands_and_changes_nothing(tiny, tmp_path, capsys):
    """A finished run reads its summary; a begun one (no summary) its newest checkpoint; a
    directory with neither (a run before its first checkpoint) is left alone; only rows whose
    every seed finished get results."""
    suite, made, _, _ = tiny
    out = tmp_path / "out"
    shutil.copytree(made, out)
    (begun,) = (out / "runs").glob("CartPole-v1__ppo__2__*")
    returns = json.loads((begun / "summary.json").read_text())["episodes"]["returns"]
    (begun / "summary.json").unlink()
    before = tree(out)
    args = ["benchmark", str(suite), "--out", str(out), "--status"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert (
        "3 runs in" in text
        and "2 finished, 1 begun, 0 without a checkpoint yet, 0 not started" in text
    )
    (line,) = [x for x in text.splitlines() if x.startswith("| ppo | CartPole-v1 | 2 |")]
    assert re.search(r"\| begun, stopped \(written \d+ (s|min|h) ago\) \| 4,096 of 4,096 \| ", line)
    assert f" | {np.mean(returns[-100:]):,.1f} | [10, 500] |" in line
    assert "Rows with every seed finished:" in text and "Left:" not in text  # (all steps run)
    assert (
        "| dqn-short | CartPole-v1 | 3,000 | 1 |" in text
        and "| ppo | CartPole-v1 | 4,096" not in text
    )
    assert tree(out) == before

    (dqn,) = (out / "runs").glob("CartPole-v1__dqn-short__3__*")
    (dqn / "summary.json").unlink()
    shutil.rmtree(dqn / "checkpoints")
    before = tree(out)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "1 finished, 1 begun, 1 without a checkpoint yet, 0 not started" in text
    assert re.search(
        r"\| dqn-short \| CartPole-v1 \| 3 \| no checkpoint yet, stopped \(written "
        r"\d+ (s|min|h) ago\) \| 0 of 3,000 \| - \|",
        text,
    )
    assert "No row has every seed finished yet." in text
    assert "not counted, with no run begun to time: dqn-short on CartPole-v1" in text
    assert tree(out) == before  # the directory a running run would be writing is still there

    # A run or a suite that another process holds (here this one) reads as running; the
    # suite itself will not start a second time on the same directory.
    run_lock, suite_lock = DirectoryLock(begun), DirectoryLock(out)
    assert run_lock.acquire() is None and suite_lock.acquire() is None
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"the suite is running (pid {os.getpid()})" in text
    assert re.search(r"\| 2 \| begun, running \(written \d+ (s|min|h) ago\) \|", text)
    assert main(args[:-1]) == 2
    assert f"another rlstore benchmark runs in {out} now (pid {os.getpid()})" in (
        capsys.readouterr().err
    )
    suite_lock.release()
    assert main(args[:-1]) == 2  # the suite would resume the run another process trains
    assert f"{begun} is being trained by another process now" in capsys.readouterr().err
    run_lock.release()

    shutil.rmtree(out)
    assert main(args) == 0
    assert (
        "0 finished, 0 begun, 0 without a checkpoint yet, 3 not started" in capsys.readouterr().out
    )
    assert not out.exists()


@pytest.mark.slow
@needs("plot", "matplotlib")
def test_suite_draws_its_curves(tiny):
    _, out, _, _ = tiny
    assert (out / "curves.png").stat().st_size > 10_000


@pytest.mark.slow
def test_results_table_equals_the_same_runs_made_by_hand(tiny, tmp_path, capsys):
    _, out, _, _ = tiny
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    by_hand = {
        "ppo": [
            ["ppo", "--num-steps", "64", "--total-timesteps", "4096", "--seed", s]
            for s in ("1", "2")
        ],
        "dqn-short": [
            [
                "dqn",
                "--learning-starts",
                "500",
                "--buffer-size",
                "1000",
                "--q-hidden",
                "32",
                "32",
                "--total-timesteps",
                "3000",
                "--seed",
                "3",
            ]
        ],
    }
    for name, commands in by_hand.items():
        scores, reached = [], []
        for i, args in enumerate(commands):
            logdir = tmp_path / f"{name}{i}"
            assert main(["train", *args, "--logdir", str(logdir), "--no-progress"]) == 0
            summary = json.loads(next(logdir.glob("*/summary.json")).read_text())
            returns, steps = summary["episodes"]["returns"], summary["episodes"]["steps"]
            scores.append(np.mean(returns[-100:]))
            # naive: the first episode whose last-20 mean meets the threshold
            for j in range(19, len(returns)):
                if np.mean(returns[j - 19 : j + 1]) >= 30:
                    reached.append(steps[j])
                    break
        row = rows[name]
        assert row["score_mean"] == pytest.approx(np.mean(scores), abs=1e-9)
        assert row["score_std"] == pytest.approx(np.std(scores), abs=1e-9)
        assert [r["score"] for r in row["runs"]] == pytest.approx(scores, abs=1e-9)
        if name == "ppo":
            assert row["steps_to_threshold"] == np.median(reached) and row["reached"] == 2
            assert not row["below_band"]
        else:
            assert row["below_band"]  # hence the exit status 1
    table = (out / "results.md").read_text()
    assert f"{rows['ppo']['score_mean']:.1f} +- {rows['ppo']['score_std']:.1f}" in table
    assert "BELOW" in table and "a test" in table


def files_in(directory: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def one_ppo_run_suite(tmp_path: Path) -> tuple[Path, str, Path, list[str]]:
    """A suite of one 2,048-step PPO CartPole run: its file, text, --out and benchmark args."""
    suite = tmp_path / "s.toml"
    text = 'seeds = [1]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 2048\n'
    suite.write_text(text)
    out = tmp_path / "out"
    return (
        suite,
        text,
        out,
        ["benchmark", str(suite), "--out", str(out), "--no-plot", "--workers", "1"],
    )


@pytest.mark.slow
def test_a_larger_budget_extends_finished_runs_and_a_smaller_one_is_refused(tmp_path, capsys):
    """Finished runs asked for more steps resume to the new total: the same run directory,
    its episodes so far unchanged. Fewer steps than a run made: one line, nothing touched."""
    suite, text, out, args = one_ppo_run_suite(tmp_path)
    assert main(args) == 0
    (run_dir,) = (out / "runs").iterdir()
    short = json.loads((run_dir / "summary.json").read_text())
    suite.write_text(text.replace("2048", "4096"))
    assert main(args) == 0
    assert "0 to resume, 1 to extend, 0 to start" in capsys.readouterr().out
    assert list((out / "runs").iterdir()) == [run_dir]
    long = json.loads((run_dir / "summary.json").read_text())
    assert long["global_step"] == 4096
    done = len(short["episodes"]["returns"])
    assert long["episodes"]["returns"][:done] == short["episodes"]["returns"]
    assert len(long["episodes"]["returns"]) > done
    suite.write_text(text.replace("2048", "1024"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "was run to 4,096 steps, more than the 1,024 asked for now" in err
    assert json.loads((run_dir / "summary.json").read_text()) == long


@pytest.mark.slow
def test_a_finished_run_whose_checkpoints_were_removed_stays_finished(tmp_path, capsys):
    """Checkpoints take room (SAC's hold its replay buffer), so users remove them once runs
    finish. Such a run reads back as finished, with its score, and nothing in it is touched
    (it was deleted and trained anew before). Asked for more steps than it made, with nothing
    to continue from: one line, exit 2, nothing touched."""
    suite, text, out, args = one_ppo_run_suite(tmp_path)
    assert main(args) == 0
    scored = json.loads((out / "results.json").read_text())["rows"]
    (run_dir,) = (out / "runs").iterdir()
    shutil.rmtree(run_dir / "checkpoints")
    files = files_in(run_dir)
    capsys.readouterr()

    assert main(["benchmark", str(suite), "--out", str(out), "--status"]) == 0
    assert "1 finished, 0 begun" in capsys.readouterr().out
    assert main(args) == 0
    assert "1 finished, 0 to resume, 0 to start" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["rows"] == scored
    assert files_in(run_dir) == files

    suite.write_text(text.replace("2048", "4096"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} finished at 2,048 steps and has no checkpoint left to continue it" in err
    assert files_in(run_dir) == files


ARCHIVE = Path(__file__).resolve().parents[1] / "results" / "finished-runs"
OFFPOLICY_PAGE = ARCHIVE.parent / "learning-offpolicy.md"


def archived_runs(folder: str) -> list[tuple[dict, dict]]:
    """(config, summary) of each run kept in the archive folder `folder` (under ARCHIVE)."""
    runs = sorted((ARCHIVE / folder).iterdir())
    assert runs
    return [
        tuple(json.loads((r / f).read_text()) for f in ("config.json", "summary.json"))
        for r in runs
    ]


def last_100_score(summary: dict) -> float:
    """A run's score as the suites give it: the mean of its last 100 training returns."""
    return float(np.mean(summary["episodes"]["returns"][-100:]))


def first_step_at_or_above(returns: list[float], steps: list[int], threshold: float) -> int:
    """The step at which the mean of 20 consecutive returns first met `threshold`, by a
    plain loop (the suite's own first_reach uses a cumulative sum)."""
    for end in range(20, len(returns) + 1):
        if sum(returns[end - 20 : end]) / 20 >= threshold:
            return steps[end - 1]
    raise AssertionError("never reached")


@pytest.mark.parametrize("suite", ["mujoco-offpolicy", "offpolicy"])
def test_archived_runs_read_back_as_the_shipped_suites_finished_runs(suite, tmp_path, capsys):
    """results/finished-runs keeps finished runs' config.json and summary.json, so
    that a machine lost does not lose them. Copied into an output directory, the shipped
    suite reads each back as finished with its summary's score (the mean of its last 100
    returns) and, on a row with a threshold, its first step there, on today's code and
    settings (a changed default would make them another suite's runs); the suite's results
    page gives both."""
    page_text = OFFPOLICY_PAGE.read_text()
    archived = archived_runs(suite)
    shutil.copytree(ARCHIVE / suite, tmp_path / "runs")
    assert main(["benchmark", suite, "--out", str(tmp_path), "--status"]) == 0
    out = capsys.readouterr().out
    assert f"{len(archived)} finished, 0 begun" in out
    for config, summary in archived:
        returns, steps = summary["episodes"]["returns"], summary["episodes"]["steps"]
        score = last_100_score(summary)
        row = (
            f"| {config['exp_name']} | {config['env_id']} | {config['seed']} | finished | "
            f"{summary['global_step']:,} of {summary['global_step']:,} | {score:,.1f} |"
        )
        (line,) = [line for line in out.splitlines() if line.startswith(row)]
        assert f"{score:,.1f}" in page_text
        if config["env_id"] == "Pendulum-v1":  # the rows whose check is reaching -200
            reached = first_step_at_or_above(returns, steps, -200)
            assert line.endswith(f"| {reached:,} |") and f"{reached:,}" in page_text


def test_the_archived_mujoco_3_4_side_runs_are_the_results_pages_figures():
    """The TD3 Hopper runs under MuJoCo 3.4.0 that the results page sets against the
    suite's (MuJoCo 4) ran to their end under that version and scored what the page says."""
    page_text = OFFPOLICY_PAGE.read_text()
    for config, summary in archived_runs("td3-hopper-mujoco-3.4.0"):
        assert config["resolved"]["versions"]["mujoco"] == "3.4.0"
        assert summary["global_step"] == config["total_timesteps"] == 1_000_000
        assert f"{last_100_score(summary):,.1f}" in page_text


def test_the_archived_sb3_td3_hopper_runs_are_the_results_pages_figures():
    """stable-baselines3's TD3 Hopper runs under MuJoCo 3.4.0 (scripts/sb3_td3_curve.py, one
    JSON line per episode), which the results page sets beside ours: each ran to 1M steps
    (its last episode ends within 1,000 steps, Hopper's time limit, of it), its episodes are
    whole and in order, and its score (the mean of its last 100 returns) is on the page, as
    are the rows of seeds 1-3 and of all seeds (mean +- population std)."""
    page_text = OFFPOLICY_PAGE.read_text()
    runs = sorted((ARCHIVE / "sb3-td3-hopper-mujoco-3.4.0").glob("seed*.jsonl"))
    assert [r.name for r in runs[:3]] == ["seed1.jsonl", "seed2.jsonl", "seed3.jsonl"]
    scores = []
    for run in runs:
        episodes = [json.loads(line) for line in run.read_text().splitlines()]
        steps = np.array([e["step"] for e in episodes])
        lengths = np.array([e["length"] for e in episodes])
        # a continued run drops the episode it was in, so a gap may exceed the length
        assert (np.diff(steps) >= lengths[1:]).all() and steps[0] == lengths[0]
        assert 1_000_000 - 1_000 < steps[-1] <= 1_000_000 and (lengths <= 1_000).all()
        scores.append(np.mean([e["return"] for e in episodes][-100:]))
        assert f"{scores[-1]:,.1f}" in page_text
    for row in scores[:3], scores:
        assert f"{np.mean(row):,.1f} +- {np.std(row):,.1f}" in page_text


def test_the_archived_td3_extra_seeds_ran_the_suites_settings():
    """TD3's Walker2d and Hopper runs of seeds beyond the suite's three, which the results
    page sets beside those rows, ran the suite's settings (their configs equal its runs' but
    for the seed and the output folder) to 1M steps and scored what the page says."""
    page_text = OFFPOLICY_PAGE.read_text()
    suite_configs = {(c["algo"], c["env_id"]): c for c, _ in archived_runs("mujoco-offpolicy")}
    for config, summary in archived_runs("td3-more-seeds"):
        suite_config = suite_configs[config["algo"], config["env_id"]]
        differ = {k for k in config if k != "resolved" and config[k] != suite_config[k]}
        assert differ == {"seed", "logdir"} and config["seed"] > 3
        assert summary["global_step"] == config["total_timesteps"] == 1_000_000
        assert f"{last_100_score(summary):,.1f}" in page_text


@pytest.mark.slow
def test_an_interrupted_suite_continues_as_the_same_runs(tmp_path):
    """SIGINT mid-run: the run checkpoints, the suite exits 130; started again, it resumes
    the run, which ends bitwise equal to a run never interrupted."""
    suite = tmp_path / "one.toml"
    suite.write_text(
        'seeds = [1]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 40_000\n'
        "overrides = { checkpoint_every = 2048 }\n"
    )
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "rlstore",
        "benchmark",
        str(suite),
        "--out",
        str(out),
        "--no-plot",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    while not list(out.glob("runs/*/checkpoints/step_*.pt")):  # polls; no time limit
        assert process.poll() is None, "the suite ended before its first checkpoint"
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    assert process.wait() == 130
    assert "interrupted" in process.stdout.read()
    (run_dir,) = (out / "runs").iterdir()
    assert not (run_dir / "summary.json").exists()

    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 to resume" in again.stdout
    assert list((out / "runs").iterdir()) == [run_dir]  # the same run directory

    reference = tmp_path / "reference"
    assert (
        main(
            [
                "train",
                "ppo",
                "--total-timesteps",
                "40000",
                "--logdir",
                str(reference),
                "--no-progress",
            ]
        )
        == 0
    )
    resumed = json.loads((run_dir / "summary.json").read_text())
    uninterrupted = json.loads(next(reference.glob("*/summary.json")).read_text())
    assert resumed["episodes"] == uninterrupted["episodes"]


@pytest.mark.slow
def test_env_runs_only_those_rows_and_the_whole_suite_reads_them_back(tmp_path, capsys):
    suite = tmp_path / "two.toml"
    suite.write_text(
        'seeds = [1]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\n'
        "overrides = { num_steps = 64 }\n"
        '[[row]]\nalgo = "ppo"\nenv = "Acrobot-v1"\nsteps = 1024\n'
        "overrides = { num_steps = 64 }\n"
    )
    out = tmp_path / "out"
    args = ["benchmark", str(suite), "--out", str(out), "--no-plot"]
    assert main([*args, "--env", "Acrobot-v1"]) == 0
    assert "1 run in" in capsys.readouterr().out
    assert [p.name.split("__")[0] for p in (out / "runs").iterdir()] == ["Acrobot-v1"]
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["env"] for r in rows] == ["Acrobot-v1"]
    acrobot = summaries(out / "runs")

    assert main(args) == 0
    whole = capsys.readouterr().out
    assert "2 runs in" in whole and "1 finished, 0 to resume, 1 to start" in whole
    assert summaries(out / "runs").items() >= acrobot.items()  # read back, not run again
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["env"] for r in rows] == ["CartPole-v1", "Acrobot-v1"]

    assert main([*args, "--env", "Pendulum-v1"]) == 2
    err = capsys.readouterr().err
    assert "has no row with --env Pendulum-v1; its envs: CartPole-v1, Acrobot-v1" in err
    assert len(err.strip().splitlines()) == 1


def test_a_part_of_a_suite_is_the_rows_and_seeds_its_flags_name(tmp_path, capsys):
    """--env, --algo and --seed each keep what they name, together what all name; a row
    keeps the seeds it has among --seed, its `need` at most those; a name no row has, or a
    part with no run, is one line."""
    rows = [
        Row("sac", "sac", "HalfCheetah-v4", 1000, [1, 2, 3], threshold=5.0, need=3),
        Row("td3", "td3", "HalfCheetah-v4", 1000, [1, 2, 3]),
        Row("td3", "td3", "Hopper-v4", 1000, [2, 4]),
    ]
    suite = Suite("three", rows)

    def part(**flags):
        return [(r.algo, r.env, r.seeds, r.need) for r in suite_part(suite, **flags).rows]

    assert part() == [(r.algo, r.env, r.seeds, r.need) for r in rows]
    assert part(algos=["td3"]) == [
        ("td3", "HalfCheetah-v4", [1, 2, 3], None),
        ("td3", "Hopper-v4", [2, 4], None),
    ]
    assert part(seeds=[2, 3]) == [
        ("sac", "HalfCheetah-v4", [2, 3], 2),
        ("td3", "HalfCheetah-v4", [2, 3], None),
        ("td3", "Hopper-v4", [2], None),
    ]
    assert part(seeds=[4]) == [("td3", "Hopper-v4", [4], None)]
    assert part(envs=["HalfCheetah-v4"], algos=["td3"], seeds=[1]) == [
        ("td3", "HalfCheetah-v4", [1], None)
    ]
    assert suite.rows == rows and rows[0].seeds == [1, 2, 3]  # the suite is left whole
    for flags, message in [
        (dict(algos=["ppo"]), "suite three has no row with --algo ppo; its algos: sac, td3"),
        (dict(seeds=[5]), "suite three has no row with --seed 5; its seeds: 1, 2, 3, 4"),
        (dict(algos=["sac"], seeds=[4]), "suite three has no row with all of --algo sac --seed 4"),
    ]:
        with pytest.raises(UsageError, match=f"^{message}$"):
            suite_part(suite, **flags)

    file = tmp_path / "two.toml"  # through the command line
    row = '[[row]]\nalgo = "{}"\nenv = "CartPole-v1"\nsteps = 512\n'
    file.write_text("seeds = [1, 2]\n" + row.format("ppo") + row.format("a2c") + "seeds = [1]\n")
    args = ["benchmark", str(file), "--out", str(tmp_path / "out"), "--status"]
    assert main([*args, "--algo", "ppo", "--seed", "2"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ppo")]
    assert [line.split(" | ")[:3] for line in table] == [["| ppo", "CartPole-v1", "2"]]
    assert main([*args, "--seed", "3"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "rlstore: error: suite two has no row with --seed 3; its seeds: 1, 2"
    ]
    out = tmp_path / "out"
    assert (
        main(
            ["benchmark", str(file), "--out", str(out), "--no-plot", "--algo", "ppo", "--seed", "2"]
        )
        == 0
    )
    assert "1 run in" in capsys.readouterr().out
    assert [p.name.split("__")[1:3] for p in (out / "runs").iterdir()] == [["ppo", "2"]]


def test_runs_start_seed_by_seed_across_the_rows(tmp_path):
    """Every row's first seed before any row's second: a suite stopped partway has seen
    every row (rows of 3, 1 and 2 seeds)."""
    rows = [
        Row("sac", "sac", "HalfCheetah-v4", 1000, [1, 2, 3]),
        Row("td3", "td3", "Hopper-v4", 1000, [3]),
        Row("ppo", "ppo", "CartPole-v1", 1000, [1, 2]),
    ]
    order = [(spec.algo, spec.seed) for spec in run_order(rows, tmp_path)]
    assert order == [("sac", 1), ("td3", 3), ("ppo", 1), ("sac", 2), ("ppo", 2), ("sac", 3)]
    assert run_order([], tmp_path) == []


def test_runs_begun_start_before_new_ones(tmp_path):
    """A suite resumed with two workers starts its interrupted runs first (here the third
    and fifth of the order), not the first two runs of the order."""
    specs = run_order([Row("sac", "sac", "HalfCheetah-v4", 1000, [1, 2, 3, 4, 5, 6])], tmp_path)
    states = ["done", "new", "interrupted", "new", "extend", "done"]
    assert [s.seed for s in still_to_run(specs, states)] == [3, 5, 2, 4]
    assert still_to_run(specs[:2], ["done", "done"]) == []


def test_ago_says_durations_as_people_do():
    assert [ago(x) for x in (0, 119, 120, 7199, 7200, 172799, 172800, -3)] == [
        "0 s",
        "119 s",
        "2 min",
        "120 min",
        "2 h",
        "48 h",
        "2 days",
        "0 s",
    ]


def test_results_pages_say_what_they_were_made_with():
    """The machine, and the versions the runs' scores depend on, as the packages say."""
    import platform

    import gymnasium as gym
    import torch

    from rlstore.machine import cpu_model

    made = made_where()
    assert made.startswith("rlstore ") and f" on {platform.machine()} ({cpu_model()}), " in made
    assert f"torch {torch.__version__}, " in made and f"gymnasium {gym.__version__}" in made
    assert f"python {platform.python_version()}, " in made


def test_core_hours_left_time_each_run_at_its_row_or_algorithm():
    # The row's pooled speed: 1,400 steps in 20 + 8 s, 50 steps/s.
    runs = [
        RunProgress("sac", "HalfCheetah-v4", "sac", 1000, 1000, 20.0),  # done: nothing left
        RunProgress("sac", "HalfCheetah-v4", "sac", 1000, 400, 8.0),  # 600 at 50/s: 12 s
        RunProgress("sac", "HalfCheetah-v4", "sac", 1000, 0, 0.0),  # 1000 at 50/s: 20 s
        RunProgress("sac", "Hopper-v4", "sac", 900, 0, 0.0),  # the algorithm's 50/s: 18 s
        RunProgress("td3", "Hopper-v4", "td3", 900, 0, 0.0),  # nothing to time it by
        RunProgress("td3", "Hopper-v4", "td3", 900, 0, 0.0),
    ]
    hours, unknown = core_hours_left(runs)
    assert hours == pytest.approx((12 + 20 + 18) / 3600)
    assert unknown == ["td3 on Hopper-v4"]
    assert core_hours_left(runs[:1]) == (0.0, [])


def test_core_hours_left_weigh_a_warm_up_by_its_seconds():
    # An off-policy run that just ended its random-action warm-up (10,000 steps in 20 s)
    # beside one learning at 4 steps/s: a mean of the two rates (252 steps/s) would put the
    # 362,000 steps left at 0.4 hours; pooled they are 38,000 steps in 7,520 s.
    runs = [
        RunProgress("crossq", "LunarLanderContinuous-v3", "crossq", 200_000, 10_000, 20.0),
        RunProgress("crossq", "LunarLanderContinuous-v3", "crossq", 200_000, 28_000, 7_500.0),
    ]
    hours, _ = core_hours_left(runs)
    assert hours == pytest.approx(362_000 * 7_520 / 38_000 / 3600)  # 19.9 core-hours


def test_a_row_with_too_few_seeds_reaching_its_threshold_is_below():
    row = Row("ppo", "ppo", "CartPole-v1", 1000, [1, 2, 3], threshold=100, need=2)
    runs = [
        {"score": 1.0, "reached_at": at, "wall_seconds": 1, "steps_per_second": 1}
        for at in (500, None, None)
    ]
    result = row_result(row, runs)
    assert result["reached"] == 1 and result["too_few_reached"] and not result["below_band"]
    assert "| BELOW |" in results_markdown(Suite("s", [row]), [result])
    runs[1]["reached_at"] = 700
    assert not row_result(row, runs)["too_few_reached"]


def test_steps_to_threshold_average_the_rows_reach_window():
    """Hand-computed: returns 0, 0, 4, 6, 8, 8 at steps 10..60. Means of 2: 0, 2, 5, 7, 8:
    5 is first met by the episode at step 40; means of 4: 2.5, 4.5, 6.5: at step 60; the
    default 20 needs 20 episodes."""
    summary = {
        "seed": 1,
        "run_dir": "r",
        "global_step": 60,
        "wall_seconds": 1.0,
        "episodes": {"returns": [0, 0, 4, 6, 8, 8], "steps": [10, 20, 30, 40, 50, 60]},
    }
    assert run_result(summary, 100, 5, reach_window=2)["reached_at"] == 40
    assert run_result(summary, 100, 5, reach_window=4)["reached_at"] == 60
    assert run_result(summary, 100, 7.5, reach_window=4)["reached_at"] is None
    assert run_result(summary, 100, 5)["reached_at"] is None
    row = Row("ppo", "ppo", "CartPole-v1", 60, [1], threshold=5, need=1, reach_window=4)
    result = row_result(row, [run_result(summary, 100, 5, reach_window=4)])
    assert "60, 1/1 reached 5 over 4 returns (need 1) |" in results_markdown(
        Suite("s", [row]), [result]
    )


def test_a_row_above_its_band_says_above_and_passes():
    row = Row("ppo", "ppo", "HalfCheetah-v4", 1000, [1, 2], band=(1400, 1534.6))
    runs = [
        {"score": s, "reached_at": None, "wall_seconds": 1, "steps_per_second": 1}
        for s in (1700.0, 1768.0)
    ]
    result = row_result(row, runs)
    assert result["above_band"] and not result["below_band"]
    assert "| above |" in results_markdown(Suite("s", [row]), [result])
    runs[1]["score"] = 1300.0  # mean 1500: inside
    assert "| ok |" in results_markdown(Suite("s", [row]), [row_result(row, runs)])


def shipped_suites() -> list[str]:
    return sorted(path.stem for path in (PRESET_DIR / "suites").glob("*.toml"))


@needs(
    "box2d,mujoco,atari,minigrid,robotics",
    "Box2D",
    "mujoco",
    "ale_py",
    "minigrid",
    "gymnasium_robotics",
)
def test_shipped_suites_pass_their_preflight():
    for name in shipped_suites():
        preflight(load_suite(find_suite(name)).rows)  # configs, env ids, extras, spaces


def test_shipped_suites_load_and_name_their_sources():
    names = shipped_suites()
    assert {"classic", "box2d", "mujoco", "atari-breakout", "atari-10m"} <= set(names)
    for name in names:
        suite = load_suite(find_suite(name))
        assert suite.rows
        for row in suite.rows:
            assert row.band is None or row.source, f"{name}: {row.name} has a band, no source"
    # `rlstore benchmark --help` names them all
    suite_help = inspect.getsource(BenchmarkArgs).split("suite: Annotated[str")[1]
    suite_help = suite_help.split('"""')[1]
    assert all(name in suite_help for name in names), suite_help
    classic = load_suite(find_suite("classic"))
    assert {(r.algo, r.env) for r in classic.rows} == {
        (a, e) for a in ("ppo", "a2c", "dqn") for e in ("CartPole-v1", "Acrobot-v1")
    }


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'seeds = [1]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nstep = 100\n',
            "unknown key 'step' (did you mean 'steps'?)",
        ),
        ("seed = [1]\n", "unknown key 'seed' (did you mean 'seeds'?)"),
        ('name = "x"\n', "has no [[row]]"),
        (
            '[[row]]\nalgo = "dqn"\nenv = "Pendulum-v1"\nsteps = 50000\n',
            "DQN needs a Discrete action space; Pendulum-v1 has",
        ),
        ('[[row]]\nalgo = "ppo"\nenv = "CartPol-v1"\nsteps = 1000\n', "unknown env id"),
        (
            '[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1000\noverrides = { lr = 1 }\n',
            "unknown key 'lr'",
        ),
        (
            '[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1000\nband = [1]\n',
            "band must be [low, high]",
        ),
        ('[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 10\n', "smaller than one rollout"),
        (
            'seeds = [1]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1000\nthreshold = 1\n'
            "need = 2\n",
            "need is a number of seeds, with a threshold to reach",
        ),
        (
            '[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\nreach_window = 100\n',
            "reach_window is a number of returns >= 1, with a threshold",
        ),
        (
            '[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\nthreshold = 1\n'
            "reach_window = 0\n",
            "reach_window is a number of returns >= 1, with a threshold",
        ),
        (
            'score = "final"\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\n',
            "score must be one of training, evaluation, success",
        ),
        (
            '[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\nnormalize = [5, 1]\n',
            "normalize must be [min, max] scores, min < max",
        ),
    ],
)
def test_bad_suites_are_one_line_and_write_nothing(tmp_path, capsys, text, message):
    suite = tmp_path / "bad.toml"
    suite.write_text(text)
    out = tmp_path / "out"
    assert main(["benchmark", str(suite), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_a_changed_suite_does_not_reuse_or_damage_old_runs(tiny, tmp_path, capsys):
    _, out, _, _ = tiny
    before = summaries(out / "runs")
    changed = tmp_path / "tiny.toml"
    changed.write_text(TINY.replace("num_steps = 64", "num_steps = 32"))
    assert main(["benchmark", str(changed), "--out", str(out)]) == 2
    assert "was made with other settings (num_steps)" in capsys.readouterr().err
    assert summaries(out / "runs") == before


@needs("sweep", "ray")
def test_address_with_no_ray_cluster_is_one_line(tmp_path, capsys):
    suite = tmp_path / "s.toml"
    suite.write_text('[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\n')
    code = main(
        [
            "benchmark",
            str(suite),
            "--out",
            str(tmp_path / "o"),
            "--address",
            f"127.0.0.1:{free_port()}",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "no Ray cluster answers at 127.0.0.1:" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--gpus-per-run", "0.5"], "--gpus-per-run needs --address"),
        (["--workers", "0"], "--workers must be at least 1 (got 0)"),
        (["--status", "--workers", "2"], "--status runs nothing; drop --workers"),
    ],
)
def test_bad_flags_are_one_line(tiny, capsys, flags, message):
    suite, out, _, _ = tiny
    assert main(["benchmark", str(suite), "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_child_processes_get_one_torch_thread(tiny):
    _, out, _, _ = tiny
    for config in (out / "runs").glob("*/config.json"):
        assert json.loads(config.read_text())["resolved"]["torch_threads"] == 1


def test_curves_draw_each_rows_reference_band_and_threshold(monkeypatch, tmp_path):
    import rlstore.plot
    from rlstore.suite import _plot_suite

    drawn = {}
    monkeypatch.setattr(rlstore.plot, "plot", lambda paths, **kwargs: drawn.update(kwargs))
    rows = load_suite(find_suite("classic")).rows
    _plot_suite(tmp_path, rows)
    for row in rows:
        reference = drawn["references"][row.env, row.name]
        assert (reference.band, reference.threshold) == (row.band, row.threshold)


def test_a_row_scored_on_evaluation_takes_the_final_evaluation(tmp_path, capsys):
    """score = "evaluation" (RL Zoo's way): each seed's score is the mean return of the final
    evaluation, which is what `rlstore eval` gives for the final model; the table says so."""
    suite = tmp_path / "eval.toml"
    suite.write_text(
        'seeds = [1]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 1024\n'
        'score = "evaluation"\noverrides = { num_steps = 64, eval_episodes = 3 }\n'
    )
    out = tmp_path / "out"
    assert main(["benchmark", str(suite), "--out", str(out), "--workers", "1", "--no-plot"]) == 0
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    (run_dir,) = (out / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [e["global_step"] for e in summary["evaluations"]] == [1024]  # only at the end
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "3"]) == 0
    evaluated = json.loads((run_dir / "eval.json").read_text())["evaluations"][-1]
    assert row["score"] == "evaluation"
    assert row["runs"][0]["score"] == evaluated["mean_return"]
    returns = summary["episodes"]["returns"]
    assert row["runs"][0]["score"] != pytest.approx(np.mean(returns[-100:]))  # not training
    table = (out / "results.md").read_text()
    assert "(eval)" in table and "the mean return of the final evaluation" in table


def test_versions_meet_a_rows_requires_by_numeric_release():
    for version, spec, meets in [
        ("3.4.0", "<3.5", True),
        ("3.5.0", "<3.5", False),
        ("4.0.0", "<3.5", False),
        ("3.10.0", "<3.5", False),  # numbers, not strings: 10 > 5
        ("2.3.3", ">=2.3, <3.5", True),
        ("2.2.9", ">=2.3, <3.5", False),
        ("2.4.0+cu121", "==2.4", True),
        ("3.5", "!=3.5.0", False),
        ("3.5", "<=3.5.0", True),
    ]:
        assert version_satisfies(version, spec) is meets, (version, spec)


def test_a_row_scored_on_other_versions_than_its_band_says_so(tmp_path):
    """`requires` names the versions a band was scored under; the verdict of a row whose
    runs (their config.json) ran on others says which; a bad `requires` is one line."""
    file = tmp_path / "s.toml"
    row = '[[row]]\nalgo = "td3"\nenv = "Hopper-v4"\nsteps = 10\nband = [2770, 3855]\n'
    file.write_text(row + 'requires = { mujoco = "<3.5" }\n')
    (loaded,) = load_suite(file).rows
    assert loaded.requires == {"mujoco": "<3.5"}
    for bad in ['{ mujoco = "3.5" }', '"mujoco<3.5"', "{ mujoco = 3.5 }"]:
        file.write_text(row + f"requires = {bad}\n")
        with pytest.raises(UsageError, match="requires maps packages to versions"):
            load_suite(file)

    def run(seed, mujoco):
        run_dir = tmp_path / f"run{seed}"
        run_dir.mkdir()
        versions = {"python": "3.11.9"} | ({"mujoco": mujoco} if mujoco else {})
        (run_dir / "config.json").write_text(json.dumps({"resolved": {"versions": versions}}))
        episodes = {"returns": [2000.0], "steps": [10]}
        summary = {
            "seed": seed,
            "run_dir": str(run_dir),
            "global_step": 10,
            "wall_seconds": 1.0,
            "episodes": episodes,
        }
        return run_result(summary, 100, None)

    runs = [run(1, "4.0.0"), run(2, "3.4.0"), run(3, "4.0.0"), run(4, None)]
    assert runs[0]["versions"]["mujoco"] == "4.0.0" and "mujoco" not in runs[3]["versions"]
    result = row_result(loaded, runs)
    assert result["other_versions"] == ["mujoco 4.0.0"]
    table = results_markdown(Suite("s", [loaded]), [result])
    assert "| BELOW (band scored under mujoco<3.5; ran mujoco 4.0.0) |" in table
    result = row_result(loaded, runs[1:2] + runs[3:])  # the band's physics, or unrecorded
    assert "| BELOW |" in results_markdown(Suite("s", [loaded]), [result])


def test_score_text_marks_sampled_evaluations_and_keeps_small_scores_readable():
    row = {"score": "evaluation", "score_mean": 0.96531, "score_std": 0.00012}
    assert score_text(row) == "0.965 +- 0.000 (eval)"
    assert score_text(row | {"sampled": True}) == "0.965 +- 0.000 (eval, sampled)"
    assert score_text({"score": "training", "score_mean": 481.23, "score_std": 20.5}) == (
        "481.2 +- 20.5"
    )
    assert score_text({"score": "success", "score_mean": 0.847, "score_std": 0.057}) == (
        "0.85 +- 0.06 (success)"
    )


def test_seeds_are_read_as_ranges_and_lists_and_labelled_back():
    from rlstore.suite import parse_seeds, seeds_label

    assert parse_seeds("4-10") == [4, 5, 6, 7, 8, 9, 10]
    assert parse_seeds("1-3,8") == [1, 2, 3, 8] and parse_seeds("4, 7,9") == [4, 7, 9]
    assert parse_seeds("2,2,1-3") == [2, 1, 3]  # each once, in the order given
    for text in ("4-10", "1-3,8", "5", "1,3,5-6"):
        assert seeds_label(parse_seeds(text)) == text
    for text, message in [("a-b", "takes seeds as 4-10"), ("5-3", "5-3 counts down")]:
        with pytest.raises(UsageError, match=message):
            parse_seeds(text)


def test_the_iqm_is_the_mean_of_the_middle_half_and_its_interval_holds_it():
    from rlstore.suite_results import iqm, iqm_interval

    assert iqm(range(1, 11)) == 5.5  # 3..8: two cut at each end
    assert iqm([1.0, 2.0, 100.0]) == pytest.approx(103 / 3)  # three: none cut (int(0.75))
    assert iqm([5, 1, 4, 2, 3, 100, -100, 0]) == 2.5  # sorted, two cut each end: 1..4
    assert iqm_interval([7.0] * 10) == (7.0, 7.0)
    scores = np.random.default_rng(1).normal(size=10)
    low, high = iqm_interval(scores)
    assert scores.min() <= low <= iqm(scores) <= high <= scores.max()
    assert iqm_interval(scores) == (low, high)  # seeded: the page says the same each time


@needs("rliable", "rliable")
def test_the_iqm_is_rliables():
    from rliable import metrics

    from rlstore.suite_results import iqm

    for n in (3, 7, 10):
        scores = np.random.default_rng(n).normal(size=n)
        assert iqm(scores) == pytest.approx(metrics.aggregate_iqm(scores[:, None]))


def test_a_rows_seeds_in_band_count_those_at_or_above_its_low_end():
    row = Row("ppo", "ppo", "CartPole-v1", 1000, list(range(1, 6)), band=(400.0, 500.0))
    runs = [
        {"score": s, "reached_at": None, "wall_seconds": 1.0, "steps_per_second": 1.0}
        for s in (399.9, 400.0, 450.0, 500.0, 510.0)
    ]
    result = row_result(row, runs)
    assert result["in_band"] == 4 and result["iqm"] == pytest.approx(450.0)
    table = results_markdown(Suite("s", [row], seeds_label="1-5"), [result], "here")
    assert table.startswith("# Benchmark: s, seeds 1-5\n")
    assert "Made by `rlstore benchmark s --seeds 1-5` with here." in table
    assert "| 4/5 | 450.0 [" in table
    assert row_result(replace(row, band=None), runs)["in_band"] is None


def test_other_seeds_run_the_rows_there_and_write_their_results_beside(tmp_path, capsys):
    file = tmp_path / "two.toml"
    file.write_text(
        'seeds = [1, 2]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 512\nneed = 2\n'
        "threshold = 1\nband = [5, 500]\noverrides = { num_steps = 64 }\n"
    )
    out = tmp_path / "out"
    args = ["benchmark", str(file), "--out", str(out), "--no-plot", "--seeds", "3-5"]
    assert main(args) == 0
    assert "3 runs in" in capsys.readouterr().out
    seeds = sorted(int(p.name.split("__")[2]) for p in (out / "runs").iterdir())
    assert seeds == [3, 4, 5]
    page = (out / "results-seeds-3-5.md").read_text()
    assert "| 3/3 |" in page and "(need 3)" in page  # need 2 of 2 -> 3 of 3
    assert json.loads((out / "results-seeds-3-5.json").read_text())["seeds"] == "3-5"
    assert not (out / "results.md").exists()
    assert main([*args[:-2], "--status", "--seeds", "3-5"]) == 0
    said = capsys.readouterr().out
    assert "3 runs in" in said and "3 finished" in said
