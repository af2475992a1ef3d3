"""scripts/benchmark.py runs each comparator as its users run it."""

import os
import subprocess
import sys
from pathlib import Path

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
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["unset"]
