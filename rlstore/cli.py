"""The `rlstore` command: parses and dispatches, nothing else.

rlstore train ppo --env CartPole-v1
rlstore train a2c --env CartPole-v1 --seed 2
rlstore train dqn --env CartPole-v1 --n-step 3 --prioritized
rlstore resume runs/CartPole-v1__ppo__1__1700000000
rlstore eval runs/CartPole-v1__ppo__1__1700000000 --episodes 20
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import json
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from rlstore import __version__, algos
from rlstore.config import flag, not_a_run_dir
from rlstore.custom_envs import load_pickled_env
from rlstore.errors import DiskFull, TrainingInterrupted, UsageError, quiet_disk_full_in_threads
from rlstore.executor import finished_steps
from rlstore.presets import (
    PRESET_DIR,
    apply_overrides,
    describe_config,
    presets_of,
    read_config,
    resolve,
    shipped_presets,
)

USAGE = """\
usage: rlstore {train,presets,resume,eval,export,check-env,benchmark,plot,sweep} ...
       rlstore --version

rlstore: a reference RL trainer built around correct, resumable storage.

commands:
  train ALGO --env ID   train an algorithm: {algos} (`rlstore train --help` says
               what each is)
  train ALGO --env ID --print-config   the resolved config and where each value came from
  presets [ALGO]   every shipped preset (or one algorithm's): envs, values, source
  resume DIR   continue an interrupted run from its newest checkpoint
  eval DIR     evaluate a run's trained policy
  export DIR   the policy as one ONNX or TorchScript file, with a model card
  check-env ENV   try your env the way training will, before you spend a run
  benchmark SUITE   run a suite of algorithms x envs x seeds; results table and curves
  plot DIR...  learning curves (mean +- std over seeds) from runs' TensorBoard files
  sweep SPEC   tune hyperparameters with Ray Tune and Optuna, several seeds per trial

Run `rlstore train ppo --help` for every option. Monitor with `tensorboard --logdir runs`.
"""


@dataclass
class ResumeArgs:
    """Continue a run from its newest valid checkpoint, in the same run directory."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """The run directory, runs/{env}__{algo}__{seed}__{time}."""
    total_timesteps: int | None = None
    """Train to this many env steps instead of the run's own total (extends schedules)."""
    progress: bool = True
    """Show a progress bar on stderr."""
    device: str | None = None
    """Continue on another device (auto, cpu, cuda, cuda:N); default: the run's own."""
    torch_threads: int | Literal["auto"] | None = None
    """Torch intra-op threads; default: the run's own setting. Another count can change the
    arithmetic's rounding, so the resumed run may then differ from an uninterrupted one."""
    trust_env_code: bool = False
    """Load the env a run saved as code (env.pkl: rlstore.train's pickle_env), which runs
    that code: only for runs you trust."""


@dataclass
class PresetsArgs:
    """List every shipped preset: its algorithm, the envs it applies to, the values it sets
    and where they come from. `rlstore train ALGO --env ID --print-config` shows every value
    a run will use."""

    algo: Annotated[str | None, tyro.conf.Positional, tyro.conf.arg(metavar="[ALGO]")] = None
    """Only this algorithm's presets."""


@dataclass
class EvalArgs:
    """Roll out a run's trained policy; print mean +- std, write eval.json."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """The run directory, runs/{env}__{algo}__{seed}__{time}."""
    episodes: int = 10
    """Number of evaluation episodes."""
    stochastic: bool = False
    """Sample actions from the policy instead of taking its mode (argmax or Gaussian mean);
    the default is deterministic, as SB3 and RL Zoo evaluate. DQN is always greedy."""
    video: bool = False
    """Record the first episode to {run_dir}/videos (needs moviepy: rlstore[video])."""
    checkpoint: str | None = None
    """Evaluate this checkpoint file (a path, or one relative to the run directory such as
    checkpoints/step_000000100000.pt) instead of the final model.pt."""
    best: bool = False
    """Evaluate best_model.pt, the policy of the best evaluation during training (a run
    trained with --eval-every), instead of the final model.pt."""
    env: str | None = None
    """Play on this env instead of the one the run recorded (an id, module:EnvId or
    module:make_env, with the same spaces): for a run whose env cannot be rebuilt."""
    action_masks: Literal["auto", "off"] = "auto"
    """auto: a policy trained under action masks plays under the env's; off: without them."""
    max_episode_steps: int | None = None
    """Cut episodes after this many steps (default: the run's time limit, else the env's
    own, else 10,000)."""
    trust_env_code: bool = False
    """Load the env a run saved as code (env.pkl: rlstore.train's pickle_env), which runs
    that code: only for runs you trust."""


@dataclass
class CheckEnvArgs:
    """Try an env the way training will take it: Gymnasium's env checker, which algorithms
    take its spaces, the encoder and action head they get, its action masks, hindsight
    replay, resume, and random steps through rlstore's checks. Exit 0 when training can
    start, 2 when it cannot."""

    env: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="ENV")]
    """An env id, module:EnvId (a module that registers it) or module:make_env."""
    env_kwargs: tuple[str, ...] = ()
    """Keyword arguments of the env's constructor, KEY=VALUE each (as rlstore train's)."""
    wrapper: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """A wrapper of the env, module:Callable; repeat the flag for more (as rlstore train's)."""
    drop_obs_keys: tuple[str, ...] = ()
    """Keys of Dict observations to leave out (as rlstore train's)."""
    steps: int = 300
    """Random steps to take through the checks."""
    seed: int = 0
    """The seed of the env's resets and of the random actions."""


@dataclass
class ExportArgs:
    """Write a run's trained policy as one file that runs without rlstore (ONNX for
    onnxruntime, TorchScript for libtorch or torch.jit.load), with README.md, a model card
    the Hugging Face Hub reads, and config.json beside it. docs/guides/export.md shows how
    to run it."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """The run directory, runs/{env}__{algo}__{seed}__{time}."""
    format: Literal["onnx", "torchscript"] = "onnx"
    """onnx (needs rlstore[export]) or torchscript."""
    out: str | None = None
    """The file to write; default RUN_DIR/export/policy.onnx (policy.torchscript.pt), or
    RUN_DIR/export-best/ with --best."""
    best: bool = False
    """Export best_model.pt, the policy of the best evaluation during training (a run
    trained with --eval-every), instead of the final model.pt."""
    values: bool = False
    """Also output the value (PPO, A2C) or the Q-values (the others)."""
    force: bool = False
    """Overwrite the file, and a model card or config.json beside it."""


@dataclass
class BenchmarkArgs:
    """Run every run of a suite (skipping finished runs, resuming interrupted ones), then
    write the results table (results.md, results.json) and curves.png. Exit status 1 when a
    row falls below its reference band."""

    suite: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SUITE")]
    """A suite TOML file, or the name of a shipped one (configs/suites/: classic, box2d,
    mujoco, atari-short, atari-breakout, atari-10m, offpolicy, mujoco-offpolicy, recurrent,
    spaces, her, value-methods, continuous-methods)."""
    out: str | None = None
    """Output directory (runs/, logs/, results); default benchmarks/{suite name}."""
    workers: int | None = None
    """Runs at a time (one torch thread each); default: this machine's cores. With
    --address the cluster's CPUs decide."""
    address: str | None = None
    """HOST:PORT of a Ray cluster to run on (needs rlstore[sweep]); default: this machine."""
    gpus_per_run: float = 0.0
    """With --address: the share of a GPU each run asks Ray for (0.25: four runs per GPU);
    the runs then train on it (--device auto). Ray hides the GPUs from runs that ask none."""
    plot: bool = True
    """Draw curves.png (needs rlstore[plot])."""
    env: tuple[str, ...] = ()
    """Run only the rows on these env ids (e.g. --env HalfCheetah-v4); the results then
    cover those rows (the whole suite again reads back what finished)."""
    algo: tuple[str, ...] = ()
    """Run only the rows of these algorithms (e.g. --algo td3); as --env."""
    seed: tuple[int, ...] = ()
    """Run only these seeds of each row (e.g. --seed 2); as --env. With --env and --algo:
    the runs all of them name."""
    seeds: str | None = None
    """Run every row on these seeds instead of the suite's own (4-10, or 4,7,9): a check on
    seeds the rows were not developed on. Results go beside the suite's own, to
    results-seeds-4-10.md and .json: each row's seeds in its band and the IQM of their
    scores with a 95% interval."""
    status: bool = False
    """Run nothing: print where each run stands (steps, score so far, from its newest
    checkpoint while it is begun), the hours left and the results of the rows whose every
    seed finished. Safe while the suite runs."""


@dataclass
class PlotArgs:
    """Learning curves from runs' TensorBoard event files: mean and a +- std band across the
    seeds of each experiment (runs of the same algorithm, env, run name and config apart
    from the seed), against env steps. Prints what it grouped."""

    paths: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR...")]
    """Run directories, directories holding runs (runs/), or globs."""
    out: str = "curves.png"
    """The PNG to write (needs rlstore[plot])."""
    png: bool = True
    """Draw the PNG; --no-png with --csv writes only the numbers."""
    csv: str | None = None
    """Also write the curves (env, name, group, runs, step, mean, std) to this CSV file."""
    tag: str = "charts/episodic_return"
    """The scalar to plot (eval/mean_return from --eval-every, losses/value_loss, ...)."""
    smooth: int | None = None
    """Trailing moving-average window, in logged points, applied to each run (1: none;
    default: 10, and 1 for eval/ tags)."""
    points: int = 200
    """Grid points per curve."""


@dataclass
class SweepArgs:
    """Search hyperparameters with Ray Tune (Optuna's TPE, early stopping of bad trials);
    each trial's score is the mean over its seeds. Writes best.toml, which
    `rlstore train ALGO --config best.toml --seed N` reproduces exactly."""

    spec: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SPEC")]
    """The sweep spec (TOML); docs/guides/many-runs.md gives the format."""
    out: str | None = None
    """Output directory; default sweeps/{spec file name}. Run again to continue."""
    address: str | None = None
    """HOST:PORT of a Ray cluster to run on; default: Ray started in this process."""
    workers: int | None = None
    """Trials at a time; default: this machine's cores, or as many as a cluster fits."""
    gpus_per_trial: float = 0.0
    """The share of a GPU each trial asks Ray for (0.25: four trials per GPU); its runs
    then train on it (--device auto)."""


def parse_train(args: list[str]):
    """Parse `<algo> [flags]` into a config; presets and --config give the defaults."""
    if any(a == "--resume" or a.startswith("--resume=") for a in args):
        raise UsageError("to continue a run, use `rlstore resume runs/<dir>` (it reads the config)")
    names = ", ".join(algos.names())
    if not args or args[0] in ("-h", "--help"):
        if args:  # the algorithms and how to get each one's flags
            print("usage: rlstore train ALGO --env ID [flags]; the algorithms:")
            for algorithm in algos.all_algorithms():
                print(f"  train {algorithm.name:<6} {algorithm.summary}")
            print("`rlstore train ALGO --help` lists its flags and defaults.")
            raise SystemExit(0)
        raise UsageError(f"name an algorithm: rlstore train {{{names}}} --env ENV_ID")
    algo, flags = args[0], args[1:]
    if algo.startswith("-"):
        raise UsageError(f"name the algorithm first: rlstore train {{{names}}} {' '.join(args)}")
    prog = f"rlstore train {algo}"
    if "-h" in flags or "--help" in flags:  # the plain defaults, and the presets that change them
        cls = resolve(algo)[0].__class__
        parse_args(cls, flags, prog, default=cls(), description=_train_help(algo, cls))
    print_config = "--print-config" in flags
    flags = [f for f in flags if f != "--print-config"]
    # The preset and the --config file give the defaults; tyro applies the flags on top.
    config_file = _scan_flag(flags, ("--config",))
    env_id = _scan_flag(flags, ("--env", "--env-id"))
    defaults, preset = resolve(algo, env_id, {"config": config_file} if config_file else None)
    cfg = parse_args(type(defaults), flags, prog, default=defaults)
    # --config may name a packaged preset: record the file it resolved to
    cfg = dataclasses.replace(cfg, config=defaults.config)
    if print_config:
        print(describe_config(algo, cfg, preset, _given_fields(cfg, flags)))
        raise SystemExit(0)
    return algo, cfg, preset


def _train_help(algo: str, cls: type) -> str:
    """`rlstore train ALGO --help`'s text: the class's own, and the presets that change the
    defaults shown."""
    lines = [(cls.__doc__ or "").strip(), "", "Defaults below are the plain ones. Presets:"]
    for p in presets_of(algo):
        lines.append(f"  {p.applies_to}: {', '.join(p.keys)}")
    lines += [
        "",
        "See every value a run will use, and where it comes from, with --print-config "
        "(`rlstore presets` lists them all).",
    ]
    return "\n".join(lines)


def _given_fields(cfg: Any, flags: list[str]) -> set[str]:
    """The config fields set by command-line flags."""
    names = {f.name for f in dataclasses.fields(cfg)}
    given = set()
    for arg in flags:
        if not arg.startswith("--"):
            continue
        name = arg[2:].split("=")[0].replace("-", "_")
        name = "env_id" if name == "env" else name
        given.add(name if name in names else name.removeprefix("no_"))
    return given & names


def _scan_flag(args: list[str], names: tuple[str, ...]) -> str | None:
    """The last value given for any of `names` in args (`--x v` or `--x=v`), as argparse would."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
    return found


def parse_args(cls: type, args: list[str], prog: str, **kwargs: Any) -> Any:
    """tyro.cli, with its parse errors turned into one-line UsageErrors (tyro draws a box)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(cls, args=args, prog=prog, **kwargs)
    except SystemExit as e:
        if not e.code:  # --help
            raise
        message = (
            _switch_given_a_value(cls, args)
            or _unknown_flags(cls, args)
            or _box_message(captured.getvalue())
        )
        raise UsageError(f"{message}; see `{prog} --help`") from None


BOOLEAN_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}


def _switch_given_a_value(cls: type, args: list[str]) -> str | None:
    """'--progress is a switch and takes no value (got False): write --progress or
    --no-progress' for the first boolean flag in args given a value, else None."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if typing.get_origin(hints[f.name]) is typing.Annotated:
            kind = typing.get_args(hints[f.name])[0]
        else:
            kind = hints[f.name]
        if kind is not bool:
            continue
        name = flag(f.name)
        for i, arg in enumerate(args):
            value = arg.partition("=")[2] if arg.startswith(name + "=") else None
            if arg in (name, "--no-" + name[2:]) and i + 1 < len(args):
                following = args[i + 1]
                value = None if following.startswith("-") else following
            if value is not None and value.lower() in BOOLEAN_WORDS:
                return (
                    f"{name} is a switch and takes no value (got {value}): write {name} or "
                    f"--no-{name[2:]}"
                )
    return None


def _unknown_flags(cls: type, args: list[str]) -> str | None:
    """'unknown option --total-timestep (did you mean --total-timesteps?)' for the flags in
    args that `cls` does not have, or None when every flag is known."""
    known = {"--help", "-h"}
    for f in dataclasses.fields(cls):
        name = flag(f.name)
        known |= {name, "--no-" + name[2:]}
    if "env_id" in {f.name for f in dataclasses.fields(cls)}:
        known |= {"--env", "--env-id"}
    unknown = [a.split("=")[0] for a in args if a.startswith("--")]
    unknown = [a for a in unknown if a not in known]
    if not unknown:
        return None
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
        others = [
            a.name
            for a in algos.all_algorithms()
            if name in {flag(f.name) for f in dataclasses.fields(a.config)}
        ]
        if others:
            parts.append(f"{name} (an option of {', '.join(sorted(others))})")
        elif close:
            parts.append(f"{name} (did you mean {close[0]}?)")
        else:
            parts.append(name)
    return f"unknown option{'s' if len(parts) > 1 else ''} {', '.join(parts)}"


def _box_message(text: str) -> str:
    """The first section of a tyro error box, on one line."""
    lines: list[str] = []
    title = "invalid arguments"
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        inner = line.strip().strip("│╭╰╮╯").strip()
        if "────" in inner:  # the title rule at the top, then a separator
            if lines:
                break
            title = inner.strip("─ ")
        elif inner:
            lines.append(inner)
    message = " ".join(lines) or title
    return message.split(". Got errors:")[0].rstrip(".")  # (a union's per-type attempts)


def parse_resume(args: list[str]):
    """The config saved in the run directory, with --total-timesteps applied."""
    parsed = parse_args(ResumeArgs, args, "rlstore resume")
    run_dir = Path(parsed.run_dir)
    record_path = run_dir / "config.json"
    if not record_path.is_file():
        raise not_a_run_dir(run_dir, "; give runs/<dir>")
    algo = json.loads(record_path.read_text()).get("algo")
    if not isinstance(algo, str):
        raise UsageError(f"{record_path} names no algorithm")
    cfg = apply_overrides(algos.get(algo).config(), read_config(record_path), str(record_path))
    # The options that do not change the algorithm; the rest is the run's own.
    changes = {"progress": parsed.progress}
    for name in ("total_timesteps", "device", "torch_threads"):
        if getattr(parsed, name) is not None:
            changes[name] = getattr(parsed, name)
    cfg = dataclasses.replace(cfg, **changes)
    if not any((run_dir / "checkpoints").glob("step_*.pt")):
        raise UsageError(f"{run_dir} has no checkpoint to resume from")
    load_pickled_env(cfg.env_id, run_dir, parsed.trust_env_code)
    return algo, cfg, run_dir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE.replace("{algos}", ", ".join(algos.builtin_names())), end="")
        return 0 if args else 2
    if args[0] == "--version":
        print(f"rlstore {__version__}")
        return 0
    command, rest = args[0], args[1:]
    quiet_disk_full_in_threads()
    from_run = None
    try:
        if command == "train":
            algo, cfg, preset = parse_train(rest)
        elif command == "resume":
            algo, cfg, from_run = parse_resume(rest)
            done = finished_steps(from_run)
            if done is not None and cfg.steps_run <= done <= cfg.total_timesteps:
                print(
                    f"rlstore: {from_run} is finished ({done:,} steps); nothing was changed. "
                    f"To train it further: rlstore resume {from_run} --total-timesteps N "
                    f"(N > {done:,})"
                )
                return 0
            preset = None
        elif command == "presets":
            parsed = parse_args(PresetsArgs, rest, "rlstore presets")
            if parsed.algo is not None:
                algos.get(parsed.algo)  # (an unknown name: one line that offers the close ones)
            for p in shipped_presets():
                if parsed.algo is not None and p.algo != parsed.algo:
                    continue
                where = p.path.relative_to(PRESET_DIR.parent)
                print(f"{p.algo} on {p.applies_to}: {where}\n    sets {', '.join(p.keys)}")
                print(f"    {p.source}")
            return 0
        elif command == "eval":
            parsed = parse_args(EvalArgs, rest, "rlstore eval")
            from rlstore.evaluate import evaluate

            evaluate(
                parsed.run_dir,
                parsed.episodes,
                not parsed.stochastic,
                parsed.video,
                parsed.checkpoint,
                best=parsed.best,
                env=parsed.env,
                action_masks=parsed.action_masks,
                max_episode_steps=parsed.max_episode_steps,
                trust_env_code=parsed.trust_env_code,
            )
            return 0
        elif command == "export":
            parsed = parse_args(ExportArgs, rest, "rlstore export")
            from rlstore.export import export

            path = export(
                parsed.run_dir, parsed.format, parsed.out, parsed.best, parsed.values, parsed.force
            )
            print(f"rlstore export: wrote {path}, and {path.parent / 'README.md'} (model card)")
            return 0
        elif command == "benchmark":
            parsed = parse_args(BenchmarkArgs, rest, "rlstore benchmark")
            from rlstore.suite import benchmark, status

            if parsed.status:
                given = [
                    flag
                    for flag, unset in [
                        ("--workers", parsed.workers is None),
                        ("--address", parsed.address is None),
                        ("--gpus-per-run", parsed.gpus_per_run == 0.0),
                    ]
                    if not unset
                ]
                if given:
                    raise UsageError(f"--status runs nothing; drop {' and '.join(given)}")
                return status(
                    parsed.suite, parsed.out, parsed.env, parsed.algo, parsed.seed, parsed.seeds
                )
            return benchmark(
                parsed.suite,
                parsed.out,
                parsed.workers,
                parsed.address,
                parsed.gpus_per_run,
                parsed.plot,
                parsed.env,
                parsed.algo,
                parsed.seed,
                parsed.seeds,
            )
        elif command == "plot":
            parsed = parse_args(PlotArgs, rest, "rlstore plot")
            from rlstore.plot import describe, plot

            png = parsed.out if parsed.png else None
            if png is None and parsed.csv is None:
                raise UsageError("--no-png without --csv writes nothing; give --csv FILE")
            for group in plot(
                list(parsed.paths), png, parsed.csv, parsed.tag, parsed.smooth, parsed.points
            ):
                print(f"rlstore plot: {describe(group)}")
            print(f"rlstore plot: wrote {', '.join(filter(None, (png, parsed.csv)))}")
            return 0
        elif command == "check-env":
            parsed = parse_args(CheckEnvArgs, rest, "rlstore check-env")
            from rlstore.check_env import check_env

            return check_env(
                parsed.env,
                parsed.env_kwargs,
                parsed.wrapper,
                parsed.drop_obs_keys,
                parsed.steps,
                parsed.seed,
            )
        elif command == "sweep":
            parsed = parse_args(SweepArgs, rest, "rlstore sweep")
            from rlstore.sweep import sweep

            return sweep(
                parsed.spec, parsed.out, parsed.address, parsed.workers, parsed.gpus_per_trial
            )
        else:
            raise UsageError(f"unknown command '{command}'; try `rlstore --help`")
        algos.get(algo).train(cfg, preset, resume=from_run)
    except UsageError as e:
        print(f"rlstore: error: {e}", file=sys.stderr)
        return 2
    except DiskFull as e:
        print(f"rlstore: error: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        return e.exit_code
    except KeyboardInterrupt:
        print("rlstore: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
