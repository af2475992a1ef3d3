"""The README's Python example runs as written, and .ci/run runs README's test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_example_runs():
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    storage = namespace["storage"]
    assert storage.step == 0 and namespace["data"]["advantages"].ndim == 1


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"## Test\n\n    (.+)\n", readme).group(1)
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
