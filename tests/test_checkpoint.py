"""Checkpoints and resume: bitwise-exact resume, atomic writes, bad files, signals, eval."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from extras import needs
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from tiny_runs import SETUPS, Watch, only_run_dir, params, replace, resumes_bitwise, same_params

from rlstore.algos import dqn, ppo
from rlstore.checkpoint import checkpoint_files, rng_state, set_rng_state
from rlstore.cli import main
from rlstore.env_snapshots import env_state, load_env_state
from rlstore.envs import make_vec_env
from rlstore.errors import TrainingInterrupted
from rlstore.files import safe_load


@pytest.mark.parametrize("fast_paths", ["auto", pytest.param("off", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "algo",
    ["ppo", "a2c", "dqn", "sac", "td3", "ddpg", "ppo_lstm"]
    + ["c51", "qrdqn", "rainbow", "pqn", "tqc", "crossq"],
)
def test_resume_from_a_middle_checkpoint_is_bitwise_identical(algo, fast_paths, tmp_path):
    """With the fast paths and without them (the reference code)."""
    module, cfg = SETUPS[algo]
    resumes_bitwise(module, replace(cfg, logdir=str(tmp_path), fast_paths=fast_paths))


def test_interrupted_dqn_resumes_to_the_same_run(tmp_path):
    """SIGINT mid-run (in-process): a checkpoint at the next step, then resume to the end."""
    _, cfg = SETUPS["dqn"]
    cfg = replace(cfg, logdir=str(tmp_path), checkpoint_every=0)
    full = dqn.train(replace(cfg, logdir=str(tmp_path / "full")))

    def interrupt(run):
        if run.global_step == 1500:
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # (ignored when the tests run in the background)
    with pytest.raises(TrainingInterrupted) as info:
        dqn.train(cfg, callbacks=[Watch(interrupt)])
    assert info.value.exit_code == 130
    (run_dir,) = Path(tmp_path).glob("CartPole-v1__dqn__*")
    # the signal lands in the iteration that ends at step 1500: it finishes, checkpoints, stops
    assert [p.name for p in checkpoint_files(run_dir / "checkpoints")] == ["step_000000001500.pt"]
    assert signal.getsignal(signal.SIGINT) is before  # handlers given back
    interrupted_at = safe_load(run_dir / "checkpoints" / "step_000000001500.pt")["wall_seconds"]
    resumed = dqn.train(cfg, resume=run_dir)
    assert resumed.episode_returns == full.episode_returns
    assert same_params(params(resumed.model), params(full.model))
    # summary.json: the whole run, both processes' wall time
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"]["returns"] == full.episode_returns
    assert summary["global_step"] == full.global_step
    assert summary["wall_seconds"] > interrupted_at > 0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_resume_appends_to_the_same_tensorboard_run(algo, tmp_path):
    """Every scalar tag of an interrupted-and-resumed run sits at exactly the steps of the
    uninterrupted run: nothing lost at the checkpoint's own step, nothing doubled."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def scalar_steps(run_dir):
        events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        events.Reload()
        return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

    module, cfg = SETUPS[algo]
    cfg = replace(cfg, track_tensorboard=True)
    reference = module.train(replace(cfg, logdir=str(tmp_path / "reference")))
    run = module.train(replace(cfg, logdir=str(tmp_path / "resumed")))
    saved = checkpoint_files(run.run_dir / "checkpoints")
    for later in saved[: len(saved) // 2]:  # as if the run had died after the middle one
        later.unlink()
    # TensorBoard reads event files in name order and names start with the unix second; a
    # real resume is a later process, so let this in-process one start in a later second.
    time.sleep(1.1)
    module.train(replace(cfg, logdir=str(tmp_path / "resumed")), resume=run.run_dir)
    assert len(list((tmp_path / "resumed").iterdir())) == 1  # the same run directory
    expected, got = scalar_steps(reference.run_dir), scalar_steps(run.run_dir)
    assert "charts/episodic_return" in expected and "charts/SPS" in expected
    assert got == expected


def test_broken_and_garbage_checkpoints_fall_back_to_the_newest_valid(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    cfg = replace(cfg, logdir=str(tmp_path))
    full = ppo.train(cfg)
    folder = full.run_dir / "checkpoints"
    newest, previous = checkpoint_files(folder)[:2]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # a truncated file
    (folder / f"step_{10**9:012d}.pt").write_bytes(b"garbage, not a checkpoint")
    (folder / f".step_{10**10:012d}.pt.x1.tmp").write_bytes(data[:100])  # a killed writer
    capsys.readouterr()
    resumed = ppo.train(cfg, resume=full.run_dir)
    err = capsys.readouterr()
    warnings = [line for line in err.err.splitlines() if "warning: skipping" in line]
    assert len(warnings) == 2 and all(w.endswith(")") for w in warnings)  # whole words
    assert any("(truncated or corrupt)" in w for w in warnings)
    assert any("(not a file of tensors and plain values)" in w for w in warnings)
    assert f"resuming from {previous}" in err.out
    assert same_params(params(resumed.model), params(full.model))


def test_atomic_write_killed_midway_leaves_previous_checkpoint(tmp_path):
    from rlstore.files import atomic_save, safe_load

    path = tmp_path / "step_000000000001.pt"
    atomic_save({"a": torch.ones(3)}, path)

    class Boom(Exception):
        pass

    class Exploding:
        def __reduce__(self):
            raise Boom

    with pytest.raises(Boom):
        atomic_save({"a": torch.zeros(3), "b": Exploding()}, path)
    assert torch.equal(safe_load(path)["a"], torch.ones(3))
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_a_resume_removes_the_partial_files_a_killed_writer_left(tmp_path):
    """kill -9 during atomic_save leaves its `.NAME.XXXXXXXX.tmp`; the resumed run (holding
    the run's lock) removes those of its own files and nothing else."""
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    stale = [
        run_dir / "checkpoints" / ".step_000000000999.pt.k1ll3d00.tmp",
        run_dir / ".model.pt.k1ll3d01.tmp",
    ]
    kept = [run_dir / "notes.tmp", run_dir / "checkpoints" / ".mine.txt"]
    for path in stale + kept:
        path.write_bytes(b"\x80partial")
    assert main(["resume", str(run_dir), "--total-timesteps", str(cfg.total_timesteps + 512)]) == 0
    assert not any(path.exists() for path in stale) and all(path.exists() for path in kept)
    assert not list(run_dir.rglob("*.pt.*.tmp"))


def test_torchs_short_write_on_a_full_disk_is_named_as_one(tmp_path, monkeypatch):
    """torch.save reports a write that ran out of room as a RuntimeError ("unexpected pos");
    atomic_save names it ENOSPC when the file system has no room for what was written, and
    leaves the previous file whole. With room, the error is torch's own."""
    import errno
    from types import SimpleNamespace

    from rlstore import files

    path = tmp_path / "step_000000000001.pt"
    files.atomic_save({"a": torch.ones(3)}, path)

    def short_write(obj, f):
        f.write(b"x" * 1000)
        f.flush()
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")

    monkeypatch.setattr(files.torch, "save", short_write)
    for free, raised in [(500, OSError), (1 << 40, RuntimeError)]:
        monkeypatch.setattr(
            files.os, "statvfs", lambda _, f=free: SimpleNamespace(f_bavail=f, f_frsize=1)
        )
        with pytest.raises(raised) as caught:
            files.atomic_save({"a": torch.zeros(3)}, path)
        if raised is OSError:
            assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
        assert torch.equal(safe_load(path)["a"], torch.ones(3))
        assert list(tmp_path.iterdir()) == [path]


def test_a_full_disk_ends_a_run_in_one_line_and_it_resumes(tmp_path, capsys, monkeypatch):
    """The disk fills at the third checkpoint: one line that names the newest whole
    checkpoint and the command that continues, exit status 1, the run directory unlocked;
    after that, `rlstore resume` finishes the run from that checkpoint."""
    import errno

    from rlstore import checkpoint

    save, calls = checkpoint.atomic_save, []

    def fills_up(obj, path):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        save(obj, path)

    monkeypatch.setattr(checkpoint, "atomic_save", fills_up)
    argv = ["train", "ppo", "--env", "CartPole-v1", "--total-timesteps", "1024", "--num-steps"]
    argv += ["32", "--checkpoint-every", "256", "--logdir", str(tmp_path), "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    run_dir = only_run_dir(tmp_path)
    assert err == [
        f"rlstore: error: the disk is full ({calls[2]}); its newest checkpoint, "
        f"step_000000000512.pt, is whole; free space, then continue with: "
        f"rlstore resume {run_dir}"
    ]
    assert [p.name for p in checkpoint_files(run_dir / "checkpoints")] == [
        "step_000000000512.pt",
        "step_000000000256.pt",
    ]
    monkeypatch.setattr(checkpoint, "atomic_save", save)
    assert main(["resume", str(run_dir), "--no-progress"]) == 0
    assert "resuming from" in capsys.readouterr().out
    assert safe_load(checkpoint_files(run_dir / "checkpoints")[0])["global_step"] == 1024


def test_a_full_disk_in_tensorboards_thread_prints_no_traceback(monkeypatch):
    """TensorBoard's writer thread meets a full disk first: its error stays quiet (the main
    thread's next write meets it and prints the one line); other threads' errors do not."""
    import errno
    import threading

    from rlstore.errors import quiet_disk_full_in_threads

    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))
    quiet_disk_full_in_threads()
    hook = threading.excepthook
    quiet_disk_full_in_threads()  # a second main() in one process wraps nothing more
    assert threading.excepthook is hook
    errors = [OSError(errno.ENOSPC, "No space left on device"), ValueError("a bug")]
    for error in errors:

        def fail(e=error):
            raise e

        thread = threading.Thread(target=fail)
        thread.start()
        thread.join()
    assert reported == errors[1:]


def test_checkpoint_of_another_algorithm_or_env_is_refused(tmp_path, capsys):
    _, ppo_cfg = SETUPS["ppo"]
    ppo_run = ppo.train(replace(ppo_cfg, logdir=str(tmp_path / "p"))).run_dir
    _, dqn_cfg = SETUPS["dqn"]
    dqn_run = dqn.train(replace(dqn_cfg, logdir=str(tmp_path / "d"))).run_dir
    newest = checkpoint_files(dqn_run / "checkpoints")[0]
    shutil.copy(newest, ppo_run / "checkpoints" / f"step_{10**9:012d}.pt")
    assert main(["resume", str(ppo_run), "--total-timesteps", str(10**9)]) == 2
    assert "is a checkpoint of dqn on CartPole-v1, not of ppo" in capsys.readouterr().err


def test_resume_takes_run_time_options_and_files_share_one_mode(tmp_path, capsys):
    """`rlstore resume DIR --no-progress --device cpu --torch-threads 1` continues the run;
    model.pt and checkpoints get the same file mode as the run's other files."""
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    for later in checkpoint_files(run_dir / "checkpoints")[:2]:
        later.unlink()
    args = ["resume", str(run_dir), "--no-progress", "--device", "cpu", "--torch-threads", "1"]
    assert main(args) == 0
    assert "resuming from" in capsys.readouterr().out
    mode = (run_dir / "config.json").stat().st_mode
    files = [run_dir / "model.pt", *checkpoint_files(run_dir / "checkpoints")]
    assert {f.stat().st_mode for f in files} == {mode}
    assert main(["resume", str(run_dir), "--learning-rate", "1"]) == 2  # not a run-time option
    assert "unknown option --learning-rate" in capsys.readouterr().err


def test_a_run_being_trained_is_not_resumed_twice_and_its_lock_dies_with_it(tmp_path, capsys):
    """Another process holds the run (a `rlstore resume` still going, say): a second resume is
    one line and changes nothing. Killed without a chance to clean up, the holder leaves no
    stale lock: the resume then goes on."""
    module, cfg = SETUPS["ppo"]
    cfg = replace(cfg, logdir=str(tmp_path))
    run_dir = module.train(cfg).run_dir
    checkpoint_files(run_dir / "checkpoints")[0].unlink()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from rlstore.locks import DirectoryLock; "
            f"lock = DirectoryLock({str(run_dir)!r}); assert lock.acquire() is None; "
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    assert main(["resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} is being trained by another process now (pid {holder.pid})" in err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before
    holder.kill()
    holder.wait()
    assert main(["resume", str(run_dir), "--no-progress"]) == 0


def test_resume_bad_input(tmp_path, capsys):
    assert main(["resume", str(tmp_path)]) == 2
    assert "is not a run directory (it has no config.json); give runs/<dir>" in (
        capsys.readouterr().err
    )
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    assert main(["resume", str(tmp_path)]) == 2
    assert f"holds 1 run ({run_dir.name}); give one of them" in capsys.readouterr().err
    assert main(["resume", str(run_dir), "--total-timesteps", "1024"]) == 2
    assert "smaller than the 2048 steps already done" in capsys.readouterr().err
    shutil.rmtree(run_dir / "checkpoints")
    assert main(["resume", str(run_dir)]) == 2
    assert "has no checkpoint" in capsys.readouterr().err
    assert main(["train", "ppo", "--resume", str(run_dir)]) == 2
    assert "use `rlstore resume" in capsys.readouterr().err


def assert_env_state_continues_exactly(env_id: str, before: int, after: int, **kwargs):
    """Step make_vec_env(env_id, **kwargs) `before` times, save its state, step it `after`
    more; fresh envs given that state must step exactly alike. Returns (state, fresh envs)."""
    envs = make_vec_env(env_id, seed=0, **kwargs)
    envs.reset(seed=0)
    for _ in range(before):
        envs.step(envs.action_space.sample())
    state = env_state(envs)
    first = [envs.step(envs.action_space.sample())[:4] for _ in range(after)]
    other = make_vec_env(env_id, seed=9, **kwargs)
    other.reset(seed=9)
    load_env_state(other, state)
    second = [other.step(other.action_space.sample())[:4] for _ in range(after)]
    for a, b in zip(first, second):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    return state, other


def test_env_state_round_trip_is_exact():
    for env_id, vectorization in [("CartPole-v1", "native"), ("Acrobot-v1", "sync")]:
        assert_env_state_continues_exactly(
            env_id, 25, 30, num_envs=3, vectorization=vectorization, max_episode_steps=20
        )


def test_async_env_state_round_trip_is_exact():
    """Async workers, reached through their WorkerAccess wrappers; saved where one env's
    episode has just ended, whose worker owes it a reset at the next step (the worker's own
    flag is down in a fresh worker), and where none has."""
    for before, reset_due in [(20, [False, False, True]), (21, [False, False, False])]:
        state, other = assert_env_state_continues_exactly(
            "CartPole-v1", before, 40, num_envs=3, vectorization="async", max_episode_steps=20
        )
        assert [chain[0]["reset_due"] for chain in state["envs"]] == reset_due
        other.close()


def leaves(tree):
    if isinstance(tree, dict):
        tree = list(tree.values())
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in leaves(item)]
    return [tree]


def test_unsigned_arrays_reach_the_checkpoint_as_tensors_torch_2_4_writes(tmp_path):
    """torch.save in torch 2.4 cannot write uint16/32/64 tensors, and every checkpoint holds
    one such array (numpy's generator key, uint32): unsigned arrays are saved as signed
    tensors of the same bits and come back with their dtype and every bit."""
    values = {np.uint16: [0, 2**16 - 1], np.uint32: [1, 2**32 - 1], np.uint64: [2, 2**64 - 1]}
    envs = make_vec_env("CartPole-v1", seed=0, num_envs=2, vectorization="sync")
    envs.reset(seed=0)
    for dtype, value in values.items():
        setattr(envs.envs[1].unwrapped, f"counts_{dtype.__name__}", np.array(value, dtype))
    np.random.seed(3)
    saved = {"rng": rng_state(), "envs": env_state(envs)}
    unsigned = (torch.uint16, torch.uint32, torch.uint64)
    assert not [x for x in leaves(saved) if isinstance(x, torch.Tensor) and x.dtype in unsigned]
    torch.save(saved, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)

    expected = np.random.random(4)
    np.random.seed(4)
    set_rng_state(loaded["rng"])
    np.testing.assert_array_equal(np.random.random(4), expected)
    other = make_vec_env("CartPole-v1", seed=9, num_envs=2, vectorization="sync")
    other.reset(seed=9)
    load_env_state(other, loaded["envs"])
    for dtype, value in values.items():
        restored = getattr(other.envs[1].unwrapped, f"counts_{dtype.__name__}")
        assert restored.dtype == dtype and restored.tolist() == value


@needs("mujoco", "mujoco")
def test_mujoco_env_state_round_trip_is_exact():
    """Ant's reward reads body positions that the last substep computed (not only qpos and
    qvel): the whole MjData must come back. Truncated every 20 steps, Ant also terminates."""
    for env_id, vectorization in [
        ("HalfCheetah-v4", "sync"),
        ("Ant-v4", "sync"),
        ("Ant-v4", "async"),
    ]:
        assert_env_state_continues_exactly(
            env_id, 25, 50, num_envs=2, vectorization=vectorization, max_episode_steps=20
        )


@needs("mujoco", "mujoco")
def test_mujoco_env_state_round_trip_is_exact_without_mj_copydata(monkeypatch):
    """MuJoCo < 3.5's bindings lack mj_copyData; the state is copied field by field then.
    (The integration state alone would fail here: Ant's first reward after it differs.)"""
    import mujoco

    monkeypatch.delattr(mujoco, "mj_copyData", raising=False)
    for env_id in ["HalfCheetah-v4", "Ant-v4"]:
        assert_env_state_continues_exactly(
            env_id, 25, 50, num_envs=2, vectorization="sync", max_episode_steps=20
        )


@needs("box2d", "Box2D")
@pytest.mark.parametrize("lean", [True, False])
def test_lunar_lander_replays_its_episode_exactly(lean, capsys):
    """A Box2D world cannot be copied; LunarLander's episode is replayed from its reset
    (seed or generator) and actions, across terminations and truncations (every 40 steps),
    in rlstore's sync vector env and Gymnasium's. BipedalWalker's does not replay exactly
    (its world keeps state across episodes): it stays unsaveable."""
    for env_id in ["LunarLander-v3", "LunarLanderContinuous-v3"]:
        state, other = assert_env_state_continues_exactly(
            env_id, 95, 120, num_envs=2, vectorization="sync", max_episode_steps=40, lean=lean
        )
        assert "warning" not in capsys.readouterr().err
    state["envs"][1][0]["__replay__"]["actions"][-1] += 1  # a replay that ends elsewhere
    load_env_state(other, state)
    assert "env 1's replayed episode ended elsewhere than it was saved" in capsys.readouterr().err
    walker = make_vec_env("BipedalWalker-v3", 1, seed=0, vectorization="sync", lean=lean)
    walker.reset(seed=0)
    assert env_state(walker) is None
    lander = make_vec_env("LunarLander-v3", 1, seed=0, vectorization="sync", lean=lean)
    lander.reset(seed=0, options={"wind": 1})  # (options it cannot replay)
    assert env_state(lander) is None


@needs("box2d", "Box2D")
def test_lunar_lander_replays_its_episode_in_async_workers(capsys):
    state, other = assert_env_state_continues_exactly(
        "LunarLander-v3", 95, 120, num_envs=2, vectorization="async", max_episode_steps=40
    )
    assert "warning" not in capsys.readouterr().err
    state["envs"][0][1]["__replay__"]["actions"][-1] += 1  # (after the worker's own layer)
    load_env_state(other, state)
    assert "env 0's replayed episode ended elsewhere than it was saved" in capsys.readouterr().err
    other.close()


def assert_resumes_envs_bitwise(module, cfg, capsys):
    """Train `cfg`, drop the newer half of its checkpoints, resume: the envs come back (no
    fresh reset) and the run ends as the uninterrupted one did. Returns the full run."""
    full = module.train(cfg)
    saved = checkpoint_files(full.run_dir / "checkpoints")
    for later in saved[: len(saved) // 2]:
        later.unlink()
    capsys.readouterr()
    resumed = module.train(cfg, resume=full.run_dir)
    assert "freshly reset" not in capsys.readouterr().err
    assert resumed.episode_returns == full.episode_returns
    assert same_params(params(resumed.model), params(full.model))
    return full


@needs("box2d", "Box2D")
def test_a_lunar_lander_run_resumes_bitwise(tmp_path, capsys):
    module, cfg = SETUPS["ppo"]
    cfg = replace(cfg, env_id="LunarLander-v3", max_episode_steps=400, logdir=str(tmp_path))
    assert_resumes_envs_bitwise(module, cfg, capsys)


@needs("mujoco", "mujoco")
def test_a_mujoco_run_resumes_bitwise_and_other_versions_resume_fresh(
    tmp_path, capsys, monkeypatch
):
    module, cfg = SETUPS["sac"]
    cfg = replace(cfg, env_id="HalfCheetah-v4", logdir=str(tmp_path))
    full = assert_resumes_envs_bitwise(module, cfg, capsys)
    saved = checkpoint_files(full.run_dir / "checkpoints")

    import mujoco

    monkeypatch.setattr(mujoco, "__version__", "0.0.0")
    for later in checkpoint_files(full.run_dir / "checkpoints")[: len(saved) // 2]:
        later.unlink()
    module.train(cfg, resume=full.run_dir)
    assert (
        "HalfCheetah-v4 was saved by another MuJoCo version; resuming with freshly reset envs"
        in (capsys.readouterr().err)
    )


def test_a_run_through_a_vector_wrapper_resumes_bitwise(tmp_path, capsys):
    """--truncation-as-termination wraps the vector env (TruncationAsTermination): its
    state is the wrapped env's, saved through the wrapper."""
    _, cfg = SETUPS["ppo"]
    cfg = replace(
        cfg,
        logdir=str(tmp_path),
        truncation_as_termination=True,
        num_envs=2,
        max_episode_steps=30,
        total_timesteps=1024,
        checkpoint_every=512,
    )
    assert_resumes_envs_bitwise(ppo, cfg, capsys)


class UnknownCartPole(CartPoleEnv):
    """An env rlstore does not know how to save (its class is not among SAVEABLE_ENVS)."""


def test_an_async_run_resumes_bitwise_and_unsaveable_envs_resume_fresh(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    cfg = replace(
        cfg,
        logdir=str(tmp_path),
        vectorization="async",
        num_envs=2,
        num_steps=64,
        total_timesteps=1024,
        checkpoint_every=512,
    )
    assert_resumes_envs_bitwise(ppo, cfg, capsys)

    gym.register("rlstore-test/Unknown-v0", entry_point=UnknownCartPole, max_episode_steps=50)
    for vectorization in ["sync", "async"]:
        unknown = replace(cfg, env_id="rlstore-test/Unknown-v0", vectorization=vectorization)
        run = ppo.train(unknown)
        checkpoint_files(run.run_dir / "checkpoints")[0].unlink()
        capsys.readouterr()
        ppo.train(unknown, resume=run.run_dir)
        assert "cannot be saved; resuming with freshly reset envs" in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_and_sigterm_write_a_checkpoint_and_exit_130_143(tmp_path):
    for signum, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143)]:
        logdir = tmp_path / str(signum)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlstore",
                "train",
                "ppo",
                "--total-timesteps",
                "10000000",
                "--checkpoint-every",
                "0",
                "--logdir",
                str(logdir),
                "--no-progress",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 120
        while not list(logdir.glob("*/events.out.tfevents.*")) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err
        assert "Traceback" not in err
        (run_dir,) = logdir.iterdir()
        assert len(checkpoint_files(run_dir / "checkpoints")) == 1
        assert f"continue with: rlstore resume {run_dir}\n" in err


def test_resuming_a_finished_run_says_so_and_changes_nothing(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path), track_tensorboard=True)).run_dir
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir} is finished (2,048 steps); nothing was changed" in out
    assert f"rlstore resume {run_dir} --total-timesteps N" in out
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.rglob("*") if p.is_file()}
    assert after == before  # no file written, none added (no new event file)


def test_a_resumed_run_summarizes_this_process(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--total-timesteps", "3072", "--no-progress"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("ppo CartPole-v1: steps 2,048 -> 3,072 (1,024 steps) in ")
