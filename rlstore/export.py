"""`rlstore export`: a trained policy as one file that runs without rlstore, ONNX (for
onnxruntime, in any language) or TorchScript (for libtorch in C++, or torch.jit.load), with
a model card beside it in the layout the Hugging Face Hub reads.

The file is the whole deterministic policy of `rlstore.load_policy(run)`, as `rlstore eval`
plays it: the observation as the env gives it in (a Dict or Tuple observation as one
input per part, named obs.KEY; Atari's as the preprocessed frame stack the run's env
returns), the observation normalization frozen inside, and the action out as the env takes
it (mode or greedy action, shifted by the space's start, clipped to a Box's bounds, in the
space's shape and dtype). Every input and output has a batch axis first. A policy trained
under action masks takes `action_mask`; a recurrent one takes its LSTM `state` (zeros at an
episode's start) and gives `next_state`. With `values`, it also gives V (`value`) or the
Q-values (`q_values`): of every action for a Q-network, of the critics at the policy's
action for an actor-critic with critics (SAC's kind).

The graph is PolicyGraph, a torch module over the policy's network, exported by
torch.onnx (its torch.export-based exporter) or traced by torch.jit; tests/test_export.py
holds both against load_policy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlstore.action_heads import masked_q
from rlstore.encoders import description_of_spec
from rlstore.errors import UsageError
from rlstore.parts import map_shapes
from rlstore.policy import Policy, find_best_model, load_policy

FORMATS = ("onnx", "torchscript")
FILE_NAMES = {"onnx": "policy.onnx", "torchscript": "policy.torchscript.pt"}
MODEL_CARD, RECORD = "README.md", "export.json"
ONNX_OPSET = 18


@dataclass(frozen=True)
class Port:
    """One input or output of the exported policy: its name, dtype and shape ("batch" first)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    least: Any = 0  # the smallest value (Discrete's and MultiDiscrete's start): an example

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


def observation_ports(description: dict[str, Any], name: str = "obs") -> list[Port]:
    """The inputs an observation space takes, one per part, in the space's order: float
    vectors as float32, images uint8, Discrete and MultiDiscrete values int64 (the env's own
    values, start included), MultiBinary int8."""
    kind = description["type"]
    if kind in ("dict", "tuple"):
        parts = description["parts"]
        named = parts.items() if kind == "dict" else enumerate(parts)
        return [port for key, part in named for port in observation_ports(part, f"{name}.{key}")]
    if kind == "discrete":
        return [Port(name, "int64", ("batch",), description["start"])]
    if kind == "multi_discrete":
        shape = ("batch", *np.shape(description["nvec"]))
        return [Port(name, "int64", shape, description["start"])]
    if kind == "multi_binary":
        return [Port(name, "int8", ("batch", *description["shape"]))]
    dtype = "uint8" if kind == "image" else "float32"
    return [Port(name, dtype, ("batch", *description["shape"]))]


class PolicyGraph(nn.Module):
    """The deterministic policy of a Policy (rlstore/policy.py) as one torch module of
    tensors only: forward(*observation parts, [action_mask], [state]) returns (action,
    [next_state], [value or q_values]), each with a batch axis first. It does in torch what
    Policy.__call__ does around the network in numpy."""

    def __init__(self, policy: Policy, values: bool = False) -> None:
        super().__init__()
        self.network = policy.network.cpu().eval()
        info = policy.info
        self.obs_shape = policy.obs_shape
        self.obs_ports = observation_ports(description_of_spec(info))
        self.masked = policy.mask_source is not None
        self.recurrent, self.greedy = policy.recurrent, policy.greedy
        self.action_critic, self.values = policy.action_critic, values
        self.head = getattr(self.network, "head", None)
        self.normalized = policy.obs_normalizer is not None
        if self.normalized:  # as ObsNormalizer: in float64, then float32, then clipped
            rms = policy.obs_normalizer.rms
            self.register_buffer("obs_mean", torch.as_tensor(rms.mean, dtype=torch.float64))
            std = np.sqrt(rms.var + policy.obs_normalizer.epsilon)
            self.register_buffer("obs_std", torch.as_tensor(std, dtype=torch.float64))
            self.clip = float(policy.obs_normalizer.clip)
        self.continuous = bool(info.get("continuous"))
        if self.continuous:  # clipped in the action space's dtype, in its shape
            dtype = getattr(torch, np.dtype(info.get("action_dtype", "float32")).name)
            self.register_buffer("low", torch.as_tensor(info["action_low"], dtype=dtype))
            self.register_buffer("high", torch.as_tensor(info["action_high"], dtype=dtype))
            self.action_shape = tuple(info.get("env_action_shape", self.low.shape))
        self.num_actions = int(info.get("action_dim", 0))
        self.action_start = int(info.get("action_start", 0))

    def inputs(self) -> list[Port]:
        ports = list(self.obs_ports)
        if self.masked:
            ports.append(Port("action_mask", "bool", ("batch", self.mask_width())))
        if self.recurrent:
            ports.append(Port("state", "float32", ("batch", *self.network.state_shape)))
        return ports

    def outputs(self) -> list[Port]:
        example = self.forward(*self.example_inputs(2))
        names = ["action"] + ["next_state"] * self.recurrent
        if self.values:
            names.append("q_values" if self.greedy or self.action_critic else "value")
        return [
            Port(name, str(out.dtype).removeprefix("torch."), ("batch", *out.shape[1:]))
            for name, out in zip(names, example, strict=True)
        ]

    def mask_width(self) -> int:
        return sum(self.head.nvec) if self.head is not None else self.num_actions

    def example_inputs(self, batch: int) -> tuple[torch.Tensor, ...]:
        """Inputs of `batch` rows to trace the graph with: each part's smallest value (zeros
        mostly), every action allowed."""
        examples = []
        for port in self.inputs():
            dtype = getattr(torch, port.dtype)
            least = True if dtype == torch.bool else np.asarray(port.least)
            values = np.broadcast_to(least, (batch, *port.shape[1:]))
            examples.append(torch.as_tensor(values.copy(), dtype=dtype))
        return tuple(examples)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = iter(inputs[: len(self.obs_ports)])
        obs = map_shapes(lambda _: next(parts), self.obs_shape)  # the parts in the space's order
        if self.normalized:
            normalized = ((obs.double() - self.obs_mean) / self.obs_std).float()
            obs = normalized.clamp(-self.clip, self.clip)
        rest = list(inputs[len(self.obs_ports) :])
        mask = rest.pop(0) if self.masked else None
        masks = () if mask is None else (mask,)
        outputs = []
        if self.greedy:
            q = self.network.q_values(obs)
            action = masked_q(q, mask).argmax(-1)
        elif self.recurrent:
            state = rest.pop(0)
            action, next_state = self.network.deterministic_action(obs, state, *masks)
        else:
            action = self.network.deterministic_action(obs, *masks)
        outputs.append(self._env_action(action))
        if self.recurrent:
            outputs.append(next_state)
        if self.values:
            if self.greedy:  # masked actions at -inf, as the action's argmax saw them
                outputs.append(masked_q(q, mask))
            elif self.action_critic:
                actions = self.network.deterministic_action(obs)
                outputs.append(self.network.q_values(obs, actions.reshape(actions.shape[0], -1)))
            elif self.recurrent:
                outputs.append(self.network.value(obs, state))
            else:
                outputs.append(self.network.value(obs))
        return tuple(outputs)

    def _env_action(self, action: torch.Tensor) -> torch.Tensor:
        if self.head is not None:  # MultiDiscrete, MultiBinary
            return self.head.env_action_tensor(action)
        if self.continuous:
            action = action.to(self.low.dtype)
            action = torch.minimum(torch.maximum(action, self.low), self.high)
            return action.reshape(action.shape[0], *self.action_shape)
        return action + self.action_start  # Discrete(n, start=s)


# -- writing the file ---------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """torch.onnx and torch.jit speak a lot (progress lines, deprecation warnings, missing
    torchvision ops); `rlstore export` says what it wrote instead."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def write_onnx(graph: PolicyGraph, path: Path) -> None:
    """The graph as an ONNX file (one file, weights inside) with a dynamic batch axis."""
    inputs, outputs = graph.inputs(), graph.outputs()
    batch = torch.export.Dim("batch", min=1)
    dynamic = (tuple({0: batch} for _ in inputs),)  # forward's one *inputs parameter
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(
            graph,
            graph.example_inputs(2),
            input_names=[p.name for p in inputs],
            output_names=[p.name for p in outputs],
            opset_version=ONNX_OPSET,
            dynamo=True,
            dynamic_shapes=dynamic,
            external_data=False,
        )
        program.save(str(path), external_data=False)


def write_torchscript(graph: PolicyGraph, path: Path) -> None:
    """The graph traced by torch.jit (torch.jit.load in Python, torch::jit::load in C++)."""
    with _quiet(), torch.no_grad():
        traced = torch.jit.trace(graph, graph.example_inputs(2), check_trace=False)
        # frozen: the weights become constants, so outputs need no torch.no_grad()
        torch.jit.freeze(traced.eval()).save(str(path))


WRITERS = {"onnx": write_onnx, "torchscript": write_torchscript}


def missing_modules(fmt: str) -> list[str]:
    """The modules `fmt` needs that do not import here (ONNX: rlstore[export])."""
    needed = ("onnx", "onnxscript") if fmt == "onnx" else ()
    return [m for m in needed if importlib.util.find_spec(m) is None]


# -- the command ----------------------------------------------------------------------------


def export(
    run_dir: str | Path,
    fmt: str = "onnx",
    out: str | Path | None = None,
    best: bool = False,
    values: bool = False,
    force: bool = False,
) -> Path:
    """Write the run's policy (model.pt, or best_model.pt with `best`) as `fmt` to `out`
    (default RUN_DIR/export/policy.onnx, or export-best/ with `best`), and the model card
    README.md and export.json beside it; returns the file's path. Refuses, writing nothing,
    where a file it would write exists and `force` is not given."""
    run_dir = Path(run_dir)
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt} is not one of {', '.join(FORMATS)}")
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; give a run directory such as runs/<dir>")
    if not (run_dir / "config.json").is_file():
        raise UsageError(f"{run_dir} is not a run directory (it has no config.json)")
    source = find_best_model(run_dir) if best else run_dir / "model.pt"
    if not source.is_file():
        raise UsageError(
            f"{run_dir} has no model.pt: the run has not finished; finish it with "
            f"`rlstore resume {run_dir}`, then export"
        )
    missing = missing_modules(fmt)
    if missing:
        raise UsageError(
            f"--format {fmt} needs rlstore[export] ({', '.join(missing)} missing): "
            f'pip install "rlstore[export]", or export --format torchscript'
        )
    folder_name = "export-best" if best else "export"
    path = Path(out) if out is not None else run_dir / folder_name / FILE_NAMES[fmt]
    if path.is_dir():
        raise UsageError(
            f"--out {path} is a directory; give the file to write, such as {path}/{FILE_NAMES[fmt]}"
        )
    folder = path.parent
    record = _read_record(folder / RECORD)
    video = _newest_video(run_dir)
    _refuse_overwrites(path, folder, record, source, video, force)

    policy = load_policy(source)
    graph = PolicyGraph(policy, values)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        WRITERS[fmt](graph, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    if record.get("source") != source.name:  # model.pt or best_model.pt
        record = {"source": source.name, "files": {}}
    record["files"][path.name] = {
        "format": fmt,
        "inputs": [p.as_dict() for p in graph.inputs()],
        "outputs": [p.as_dict() for p in graph.outputs()],
    }
    record.update(algo=policy.algo, env_id=policy.env_id, global_step=policy.global_step)
    _write_text(folder / RECORD, json.dumps(record, indent=2) + "\n")
    shutil.copyfile(run_dir / "config.json", folder / "config.json")
    if video is not None:
        shutil.copyfile(video, folder / "replay.mp4")
    card = model_card(
        record,
        json.loads((run_dir / "config.json").read_text()),
        _evaluation(run_dir, source),
        video is not None,
    )
    _write_text(folder / MODEL_CARD, card)
    return path


def _read_record(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) and "files" in record else {}


def _refuse_overwrites(
    path: Path,
    folder: Path,
    record: dict[str, Any],
    source: Path,
    video: Path | None,
    force: bool,
) -> None:
    """One UsageError naming the first file an export would overwrite that is not its own
    to rewrite: the output file; a README.md, config.json or replay.mp4 that no export of
    the same model wrote. --force overwrites them."""
    if force:
        return
    hint = "; give another --out, or --force to overwrite"
    if path.exists():
        raise UsageError(f"{path} exists{hint}")
    ours = record.get("source") == source.name
    if record and not ours:
        raise UsageError(
            f"{folder} holds the export of {record['source']}, not of {source.name}{hint}"
        )
    if not ours:
        for name in (MODEL_CARD, "config.json", RECORD) + (("replay.mp4",) if video else ()):
            if (folder / name).exists():
                raise UsageError(f"{folder / name} exists{hint}")


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _newest_video(run_dir: Path) -> Path | None:
    videos = sorted((run_dir / "videos").glob("*.mp4"), key=lambda p: p.stat().st_mtime)
    return videos[-1] if videos else None


def _evaluation(run_dir: Path, source: Path) -> dict[str, Any] | None:
    """The newest deterministic (or greedy) evaluation of `source` in eval.json."""
    try:
        entries = json.loads((run_dir / "eval.json").read_text()).get("evaluations", [])
    except (OSError, json.JSONDecodeError):
        return None
    mine = [e for e in entries if e.get("model") == source.name and e.get("deterministic")]
    return mine[-1] if mine else None


# -- the model card -------------------------------------------------------------------------

CONFIG_LEFT_OUT = ("algo", "preset", "config", "resolved", "logdir", "progress", "device")


def model_card(
    record: dict[str, Any],
    config: dict[str, Any],
    evaluation: dict[str, Any] | None,
    video: bool,
) -> str:
    """README.md for the Hugging Face Hub: a YAML header (library, tags, the env, the
    evaluation's mean +- std as RL Zoo's cards give it), then what the files are, how to
    run them, the hyperparameters and the command that trains the run again."""
    algo, env_id = record["algo"], record["env_id"]
    formats = sorted({entry["format"] for entry in record["files"].values()})
    header = [
        "---",
        "library_name: rlstore",
        "tags:",
        f"- {env_id}",
        "- deep-reinforcement-learning",
        "- reinforcement-learning",
        f"- {algo}",
        *(f"- {fmt}" for fmt in formats),
    ]
    if evaluation is not None:
        score = f"{evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f}"
        header += [
            "model-index:",
            f"- name: {algo.upper()}",
            "  results:",
            "  - task:",
            "      type: reinforcement-learning",
            "      name: reinforcement-learning",
            "    dataset:",
            f"      name: {env_id}",
            f"      type: {env_id}",
            "    metrics:",
            "    - type: mean_reward",
            f"      value: {score}",
            "      name: mean_reward",
            "      verified: false",
        ]
    header.append("---")
    lines = [
        *header,
        "",
        f"# {algo.upper()} on {env_id}",
        "",
        f"A policy trained by rlstore's `{algo}` for {record['global_step']:,} env steps "
        f"({record['source']} of the run), exported to run without rlstore.",
        "",
        "## Results",
        "",
    ]
    if evaluation is None:
        lines.append("Not evaluated: `rlstore eval RUN_DIR` writes eval.json; export again.")
    else:
        lines.append(
            f"Mean return {evaluation['mean_return']:.2f} +/- {evaluation['std_return']:.2f} "
            f"over {evaluation['episodes']} episodes ({evaluation['mode']}), "
            f"mean episode length {evaluation['mean_length']:.1f}."
        )
    if video:
        lines += ["", "![the policy playing](replay.mp4)"]
    lines += ["", "## Files", ""]
    for name, entry in sorted(record["files"].items()):
        lines.append(f"- `{name}` ({entry['format']}). Inputs:")
        lines += [f"  - {_describe_port(port)}" for port in entry["inputs"]]
        lines.append("  Outputs:")
        lines += [f"  - {_describe_port(port)}" for port in entry["outputs"]]
    lines += ["", "## Usage", ""]
    for name, entry in sorted(record["files"].items()):
        lines += _usage(name, entry)
    lines += ["", "## Hyperparameters", "", "| config field | value |", "| --- | --- |"]
    lines += [
        f"| `{key}` | `{json.dumps(value)}` |"
        for key, value in config.items()
        if key not in CONFIG_LEFT_OUT
    ]
    lines += [
        "",
        "## Training it again",
        "",
        "config.json beside this card is the run's configuration:",
        "",
        "```bash",
        'pip install "rlstore"',
        f"rlstore train {algo} --config config.json --logdir runs",
        "```",
        "",
    ]
    return "\n".join(lines)


def _describe_port(port: dict[str, Any]) -> str:
    shape = ", ".join(str(d) for d in port["shape"])
    return f"`{port['name']}`: {port['dtype']} ({shape})"


def _usage(name: str, entry: dict[str, Any]) -> list[str]:
    feeds = ", ".join(f'"{p["name"]}": {p["name"].replace(".", "_")}' for p in entry["inputs"])
    if entry["format"] == "onnx":
        return [
            "```python",
            "import onnxruntime",
            "",
            f'session = onnxruntime.InferenceSession("{name}")',
            f'action = session.run(["action"], {{{feeds}}})[0]',
            "```",
            "",
        ]
    args = ", ".join(p["name"].replace(".", "_") for p in entry["inputs"])
    return [
        "```python",
        "import torch",
        "",
        f'policy = torch.jit.load("{name}")',
        f"action = policy({args})[0]  # torch tensors, a batch axis first",
        "```",
        "",
    ]
