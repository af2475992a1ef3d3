"""`rlstore plot`: mean and std across seeds from event files, checked through --csv."""

import csv
import json
import sys

import numpy as np
import pytest
from extras import needs
from torch.utils.tensorboard import SummaryWriter

from rlstore.cli import main
from rlstore.plot import smooth


def fake_run(path, name, points, env="Fake-v0", tag="charts/episodic_return", **config):
    """A run directory with config.json and the given (step, value) points for `tag`."""
    path.mkdir(parents=True)
    record = {"algo": "ppo", "env_id": env, "exp_name": name, **config}
    (path / "config.json").write_text(json.dumps(record))
    writer = SummaryWriter(str(path))
    for step, value in points:
        writer.add_scalar(tag, value, step)
    writer.close()


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture
def runs(tmp_path):
    """Two seeds of linear curves logged at different steps, and a run of another group.
    Linear curves interpolate exactly, so the mean and std are known in closed form."""
    fake_run(tmp_path / "runs" / "a1", None, [(s, s) for s in range(0, 1001, 100)], seed=1)
    fake_run(
        tmp_path / "runs" / "a2", None, [(s, 3 * s + 10) for s in range(50, 1000, 100)], seed=2
    )
    fake_run(tmp_path / "runs" / "b1", "tuned", [(s, 7.0) for s in range(0, 501, 50)])
    return tmp_path / "runs"


def test_mean_and_std_across_seeds_through_csv(runs, tmp_path, capsys):
    out = tmp_path / "curves.csv"
    args = ["plot", str(runs), "--csv", str(out), "--no-png", "--points", "10", "--smooth", "1"]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "Fake-v0 ppo: 2 runs (seeds 1, 2); cut at step 950, where its shortest run ends " in said
    assert "Fake-v0 tuned: 1 run (seeds None)" in said
    rows = read_csv(out)
    ppo = [r for r in rows if r["name"] == "ppo"]
    steps = np.array([float(r["step"]) for r in ppo])
    # the range both runs cover: 50 .. 950
    np.testing.assert_allclose(steps, np.linspace(50, 950, 10))
    # y1 = s, y2 = 3 s + 10: mean 2 s + 5, population std s + 5
    np.testing.assert_allclose([float(r["mean"]) for r in ppo], 2 * steps + 5, rtol=1e-6)
    np.testing.assert_allclose([float(r["std"]) for r in ppo], steps + 5, rtol=1e-6)
    assert {r["runs"] for r in ppo} == {"2"}
    tuned = [r for r in rows if r["name"] == "tuned"]
    assert len(tuned) == 10 and all(float(r["mean"]) == 7.0 and float(r["std"]) == 0 for r in tuned)


def test_smoothing_is_a_trailing_moving_average():
    rng = np.random.default_rng(0)
    values = rng.normal(size=50)
    for window in (1, 3, 10):
        naive = [values[max(0, i - window + 1) : i + 1].mean() for i in range(len(values))]
        np.testing.assert_allclose(smooth(values, window), naive, rtol=1e-12, atol=1e-12)


@needs("plot", "matplotlib")
def test_png_is_drawn_headless_and_is_not_blank(runs, tmp_path, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    png = tmp_path / "curves.png"
    assert main(["plot", str(runs / "*"), "--out", str(png), "--smooth", "2"]) == 0
    import matplotlib.image

    image = matplotlib.image.imread(str(png))
    colors = np.unique(image.reshape(-1, image.shape[-1]), axis=0)
    assert png.stat().st_size > 10_000 and len(colors) > 50


def test_any_scalar_tag(tmp_path):
    fake_run(tmp_path / "r", None, [(s, s / 10) for s in range(0, 101, 10)], tag="losses/x")
    out = tmp_path / "x.csv"
    assert (
        main(
            [
                "plot",
                str(tmp_path / "r"),
                "--tag",
                "losses/x",
                "--csv",
                str(out),
                "--no-png",
                "--points",
                "11",
                "--smooth",
                "1",
            ]
        )
        == 0
    )
    np.testing.assert_allclose([float(r["mean"]) for r in read_csv(out)], np.arange(11))


@pytest.mark.parametrize(
    "args, message",
    [
        (["nowhere/*"], "'nowhere/*' matches no file or directory"),
        (["{runs}", "--tag", "charts/nothing"], "has the scalar tag 'charts/nothing'"),
        (["{runs}", "--smooth", "0"], "--smooth must be at least 1"),
    ],
)
def test_bad_input_is_one_line(runs, capsys, args, message):
    args = [a.replace("{runs}", str(runs)) for a in args]
    assert main(["plot", *args, "--no-png", "--csv", str(runs / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_outputs_go_to_new_directories_and_bad_ones_are_one_line(runs, tmp_path, capsys):
    csv_path = tmp_path / "new" / "deeper" / "curves.csv"
    assert main(["plot", str(runs), "--no-png", "--csv", str(csv_path)]) == 0
    assert len(read_csv(csv_path)) > 0
    (tmp_path / "a_file").write_text("keep")
    bad = [
        (tmp_path, f"--csv {tmp_path} is a directory; give a file name"),
        (tmp_path / "a_file" / "x.csv", "a_file is a file; give a directory"),
    ]
    for out, message in bad:
        capsys.readouterr()
        assert main(["plot", str(runs), "--no-png", "--csv", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "a_file").read_text() == "keep"


def test_missing_matplotlib_names_the_extra(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    assert main(["plot", str(runs), "--out", str(tmp_path / "x.png")]) == 2
    assert 'pip install "rlstore[plot]"' in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_a_resumed_run_counts_each_step_once(tmp_path):
    """A resume opens a second event file with purge_step (as rlstore resume does): the
    events the first process logged after the checkpoint are dropped."""
    run = tmp_path / "r"
    fake_run(run, None, [(s, 1.0) for s in range(0, 1001, 100)])
    writer = SummaryWriter(str(run), purge_step=501)
    for s in range(600, 1001, 100):
        writer.add_scalar("charts/episodic_return", 2.0, s)
    writer.close()
    out = tmp_path / "r.csv"
    assert (
        main(["plot", str(run), "--csv", str(out), "--no-png", "--points", "11", "--smooth", "1"])
        == 0
    )
    means = [float(r["mean"]) for r in read_csv(out)]
    assert means[:6] == [1.0] * 6 and means[-4:] == [2.0] * 4  # steps 0..500 | 700..1000


def test_runs_of_other_budgets_or_settings_are_other_groups(tmp_path, capsys):
    """A 100k-step run and three 4k-step runs are two curves, labelled by what differs; the
    seeds of each are averaged, and settings that do not change the run do not split them."""
    for seed in (1, 2, 3):
        fake_run(
            tmp_path / f"short{seed}",
            None,
            [(s, seed) for s in range(0, 4001, 1000)],
            seed=seed,
            total_timesteps=4000,
            device=f"cuda:{seed}",
        )
    fake_run(
        tmp_path / "long",
        None,
        [(s, 9.0) for s in range(0, 100_001, 10_000)],
        seed=1,
        total_timesteps=100_000,
    )
    out = tmp_path / "c.csv"
    args = ["plot", str(tmp_path / "*"), "--csv", str(out), "--no-png", "--points", "5"]
    assert main(args) == 0
    said = capsys.readouterr().out
    assert "ppo (total_timesteps=4000): 3 runs (seeds 1, 2, 3)" in said
    assert "ppo (total_timesteps=100000): 1 run (seeds 1)" in said and "cut" not in said
    rows = read_csv(out)
    long = [r for r in rows if r["group"] == "ppo (total_timesteps=100000)"]
    short = [r for r in rows if r["group"] == "ppo (total_timesteps=4000)"]
    assert float(long[-1]["step"]) == 100_000 and float(short[-1]["step"]) == 4000
    assert {float(r["mean"]) for r in short} == {2.0} and {r["runs"] for r in short} == {"3"}


def test_step_ticks_and_the_y_label_say_what_is_drawn():
    from rlstore.plot import steps_label, y_label

    assert [steps_label(s) for s in (0, 500, 20_000, 100_000, 1_500_000, 10_000_000)] == [
        "0",
        "500",
        "20k",
        "100k",
        "1.5M",
        "10M",
    ]
    assert y_label("charts/episodic_return", 10) == (
        "episodic return, mean over seeds, smoothed over 10 points"
    )
    assert y_label("losses/x", 1) == "losses/x, mean over seeds"


def test_plot_with_no_argument_says_what_it_expects(capsys):
    assert main(["plot"]) == 2
    err = capsys.readouterr().err
    assert "give run directories, folders holding runs, or globs: rlstore plot runs/" in err


def test_no_png_writes_only_the_csv_and_smoothing_defaults_to_ten(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default, ten = tmp_path / "default.csv", tmp_path / "ten.csv"
    assert main(["plot", str(runs), "--csv", str(default), "--no-png"]) == 0
    assert not (tmp_path / "curves.png").exists()
    assert main(["plot", str(runs), "--csv", str(ten), "--no-png", "--smooth", "10"]) == 0
    assert read_csv(default) == read_csv(ten)
    one = tmp_path / "one.csv"
    assert main(["plot", str(runs), "--csv", str(one), "--no-png", "--smooth", "1"]) == 0
    assert read_csv(one) != read_csv(default)


def test_evaluation_curves_are_drawn_unsmoothed_from_eval_mean_return(tmp_path):
    """--tag eval/mean_return: each seed's evaluations as logged (no smoothing by default),
    averaged over seeds at the evaluation steps."""
    from tiny_runs import SETUPS, replace

    from rlstore.algos import ppo
    from rlstore.plot import plot

    _, cfg = SETUPS["ppo"]
    histories = []
    for seed in (1, 2):
        run = ppo.train(
            replace(cfg, logdir=str(tmp_path / "runs"), seed=seed, eval_every=512, eval_episodes=2)
        )
        summary = json.loads((run.run_dir / "summary.json").read_text())
        histories.append([e["mean_return"] for e in summary["evaluations"]])
    csv_path = tmp_path / "eval.csv"
    plot(
        [str(tmp_path / "runs")], png=None, csv_path=str(csv_path), tag="eval/mean_return", points=4
    )
    rows = list(csv.DictReader(csv_path.open()))
    assert [float(r["step"]) for r in rows] == [512, 1024, 1536, 2048]
    expected = np.mean(histories, axis=0)
    np.testing.assert_allclose([float(r["mean"]) for r in rows], expected, rtol=1e-6)


def test_runs_made_before_a_config_field_existed_group_with_runs_at_its_default(tmp_path):
    """A run whose config.json lacks a field added later (eval_every, say) is the same
    experiment as one with that field at its default."""
    from rlstore.plot import group_runs

    for seed, drop in ((1, True), (2, False)):
        run = tmp_path / f"CartPole-v1__ppo__{seed}__1"
        run.mkdir()
        record = {
            "algo": "ppo",
            "env_id": "CartPole-v1",
            "seed": seed,
            "eval_every": 0,
            "eval_episodes": 10,
        }
        if drop:
            del record["eval_every"], record["eval_episodes"]
        (run / "config.json").write_text(json.dumps(record))
        with SummaryWriter(str(run)) as writer:
            for step in range(3):
                writer.add_scalar("charts/episodic_return", step, step)
    (group,) = group_runs(sorted(tmp_path.iterdir()), "charts/episodic_return", 1)
    assert group.seeds == [1, 2]


def test_a_finished_run_without_event_files_draws_its_episodes_from_summary_json(tmp_path):
    """A run kept as config.json and summary.json alone (results/finished-runs) gives the
    same training-episode curves as its event files did: the same steps, the values to
    float32 (TensorBoard's precision). Other tags are then missing."""
    from tiny_runs import SETUPS, replace

    from rlstore.algos import ppo
    from rlstore.plot import read_scalars

    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path / "runs"), seed=1)).run_dir
    tags = ["charts/episodic_return", "charts/episodic_length"]
    logged = {tag: read_scalars(run_dir, tag) for tag in tags}
    assert len(logged["charts/episodic_return"][0]) > 5

    def assert_draws_as_logged(run_dir):
        for tag in tags:
            steps, values = read_scalars(run_dir, tag)
            np.testing.assert_array_equal(steps, logged[tag][0])
            np.testing.assert_array_equal(values.astype(np.float32), logged[tag][1])

    for event_file in run_dir.glob("events.out.tfevents.*"):
        event_file.unlink()
    assert_draws_as_logged(run_dir)
    assert read_scalars(run_dir, "losses/value_loss") is None
    (run_dir / "summary.json").unlink()  # (a run that never finished, without event files)
    assert read_scalars(run_dir, "charts/episodic_return") is None

    # The same run trained with --no-track-tensorboard writes no event files and draws the same.
    quiet = replace(cfg, logdir=str(tmp_path / "quiet"), seed=1, track_tensorboard=False)
    quiet_dir = ppo.train(quiet).run_dir
    assert not list(quiet_dir.glob("events.out.tfevents.*"))
    assert_draws_as_logged(quiet_dir)
