"""The machine a run is on: its device, cores, torch threads, free memory, CPU model and
package versions, and torch's start-up settings. Both the Run (rlstore/run.py) and the
executors of many runs (rlstore/executor.py) read it.

torch is imported inside the functions that need it: the executors and `rlstore --help`
import this module without loading torch.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlstore.errors import UsageError
from rlstore.text import size

if TYPE_CHECKING:
    import torch

RUNS_AT_ONCE = "RLSTORE_RUNS_AT_ONCE"  # runs sharing this machine, for --torch-threads auto

# The packages a run's numbers depend on; those not installed are left out.
RECORDED_PACKAGES = (
    "rlstore",
    "torch",
    "numpy",
    "gymnasium",
    "mujoco",
    "box2d",
    "box2d-py",
    "ale-py",
)


def available_cores() -> int:
    """The cores this process may use (its CPU affinity, where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def resolve_device(spec: str) -> torch.device:
    """'auto' -> CUDA when available, else CPU; 'cuda' without a GPU is a UsageError."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"unknown --device '{spec}'; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"unknown --device '{spec}'; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"--device {spec} was asked for but no CUDA GPU is available; "
                "use --device cpu (or auto)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) present"
            )
    return device


def available_memory(device: torch.device) -> int | None:
    """Bytes that can still be allocated on `device` (host: Linux's MemAvailable; CUDA: the
    driver's free memory), or None where the system does not say."""
    if device.type == "cuda":
        import torch

        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_memory(needed: dict[torch.device, int], what: str, fix: str) -> None:
    """A UsageError, before anything is allocated, when `needed` (bytes per device) does
    not fit in what each device has available."""
    for device, nbytes in needed.items():
        free = available_memory(device)
        if free is not None and nbytes > free:
            where = "host" if device.type == "cpu" else str(device)
            raise UsageError(
                f"{what} needs {size(nbytes)} of {where} memory, but only {size(free)} is "
                f"available; {fix}"
            )


# A weight matrix this large (1024 x 1024 critics) makes an MLP's products worth a second
# thread even under the passive wait policy; 512- and 256-wide networks run slower with it
# (the measurements: docs/maintainers/fast-paths.md, "Threads").
WIDE_MATRIX = 1024 * 1024


def auto_threads(cnn: bool, widest_matrix: int = 0) -> int:
    """--torch-threads auto: one thread for MLPs (under the passive wait policy a second slows
    them down, SAC's 256-256 included; spinning threads would speed a lone SAC run up and
    collapse shared ones: docs/maintainers/fast-paths.md); for a CNN policy (Atari), whose
    convolutions do gain from more, or an MLP with a weight matrix of WIDE_MATRIX weights or
    more (`widest_matrix`), the cores divided by the runs that share them:
    RLSTORE_RUNS_AT_ONCE, which the executors of `rlstore benchmark` and `rlstore sweep` set
    (1 for a run started by hand). Idle threads sleep (OMP_WAIT_POLICY=PASSIVE, set in
    rlstore/__init__.py), so runs started by hand side by side do not collapse either
    (docs/guides/atari.md)."""
    if not cnn and widest_matrix < WIDE_MATRIX:
        return 1
    cores = available_cores()
    try:
        runs = max(1, int(os.environ.get(RUNS_AT_ONCE, "1")))
    except ValueError:
        runs = 1
    return max(1, cores // runs)


def flush_denormals(on: bool) -> None:
    """Flush denormal floats (below ~1e-38) to zero in this thread, as TensorFlow does on
    CPU; numpy in the same thread is affected too, hence a Run turns it off when it ends."""
    import torch

    torch.set_flush_denormal(on)


# skip_dynamo_import writes a cache attribute on torch's own functions, a private detail: it
# runs only on the torch versions it is tested with (tests/test_fast.py); on others a run
# starts about 0.9 s later and is otherwise the same.
SKIP_DYNAMO_TORCH_VERSIONS = ("2.13.",)


def skip_dynamo_import() -> None:
    """Keep torch.optim from importing its compiler stack (torch._dynamo, about 0.9 s at
    start-up) only to switch it off: it wraps Optimizer methods and the functional
    adam/rmsprop in torch._disable_dynamo, which imports torch._dynamo on first use and
    caches the disabled function as `fn.__dynamo_disable`. rlstore never compiles, so this
    sets that cache to the plain function, where the wrappers are the ones expected; a
    torch without them is left alone. (Optimizer.step imports it too: rlstore's loops step
    their optimizers through optimizer_step.)"""
    import torch

    disable = getattr(torch, "_disable_dynamo", None)
    tested = torch.__version__.startswith(SKIP_DYNAMO_TORCH_VERSIONS)
    if disable is None or "torch._dynamo" in sys.modules or not tested:
        return
    inner_code = disable(lambda: None).__code__
    functional = [importlib.import_module(f"torch.optim.{name}") for name in ("adam", "rmsprop")]
    candidates = [*vars(torch.optim.Optimizer).values(), functional[0].adam, functional[1].rmsprop]
    for wrapper in candidates:
        while callable(wrapper):
            code = getattr(wrapper, "__code__", None)
            if code is not None and (code is inner_code or code.co_name == "maybe_fallback"):
                target = wrapper.__wrapped__
                target.__dynamo_disable = target
            wrapper = getattr(wrapper, "__wrapped__", None)


_PLAIN_STEPS: dict[type, Any] = {}  # optimizer class -> its step without the wrapper


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """optimizer.step(), without the wrapper torch puts around every optimizer's step for
    torch.compile (_use_grad_for_differentiable: its graph breaks import torch._dynamo, as
    skip_dynamo_import says, about 0.9 s at start-up, which rlstore, never compiling, does
    not need): the step itself with gradients off, as the wrapper calls it, on the torch
    versions skip_dynamo_import is tested on, for an optimizer with no step hooks (they and
    the profiler's label live in the outer wrapper) that is not differentiable;
    optimizer.step() elsewhere. The same update either way (tests/test_fast.py)."""
    import torch
    from torch.optim import optimizer as torch_optimizer

    kind = type(optimizer)
    if kind not in _PLAIN_STEPS:
        _PLAIN_STEPS[kind] = None
        wrapper = kind.step
        tested = torch.__version__.startswith(SKIP_DYNAMO_TORCH_VERSIONS)
        while tested and callable(wrapper):
            code = getattr(wrapper, "__code__", None)
            if code is not None and code.co_name == "_use_grad":
                _PLAIN_STEPS[kind] = wrapper.__wrapped__
                break
            wrapper = getattr(wrapper, "__wrapped__", None)
    plain = _PLAIN_STEPS[kind]
    if plain is None or (
        optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or torch_optimizer._global_optimizer_pre_hooks
        or torch_optimizer._global_optimizer_post_hooks
        or optimizer.defaults.get("differentiable", False)
    ):
        optimizer.step()
        return
    with torch.no_grad():
        plain(optimizer)


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else what `platform` knows), for
    config.json and results pages: seeded runs are bitwise the same only on the same CPU
    model, and runs' figures from two machines must be told apart."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    return platform.processor() or platform.machine()


def machine_name() -> str:
    """The architecture and CPU model, as results pages name the machine they ran on
    ("x86_64 (Intel(R) Xeon(R) Processor)")."""
    return f"{platform.machine()} ({cpu_model()})"


def package_versions() -> dict[str, str]:
    """Python's and each installed RECORDED_PACKAGES's version, for config.json."""
    import torch

    versions = {"python": platform.python_version()}
    for package in RECORDED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    # torch's own string names its build (2.4.0+cu121), which PyPI's wheels leave out of
    # their metadata
    versions["torch"] = torch.__version__
    return versions
