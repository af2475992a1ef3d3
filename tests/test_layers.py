"""rlstore's import graph: every module in a layer of docs/maintainers/layout.md, no import
pointing to a higher layer, no circle. Module-level and function-level imports alike;
imports under `if TYPE_CHECKING:` are annotations only and do not count."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlstore"
LAYOUT = ROOT / "docs" / "maintainers" / "layout.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(source: str, modules: set[str]) -> set[str]:
    """The rlstore modules (names relative to the package: "envs", "algos.ppo") that
    `source` imports anywhere outside `if TYPE_CHECKING:` blocks; `from rlstore import x`
    names module x where x is one, else the package itself ("")."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [child.module] + [f"{child.module}.{a.name}" for a in child.names]
            for name in names:
                if name == "rlstore" or name.startswith("rlstore."):
                    relative = name.removeprefix("rlstore").removeprefix(".")
                    if relative in modules:
                        found.add(relative)
                    elif relative.rpartition(".")[0] in modules:  # from rlstore.x import name
                        found.add(relative.rpartition(".")[0])
            visit(child)

    visit(ast.parse(source))
    return found


def graph() -> dict[str, set[str]]:
    modules = set(MODULES)
    # (the package itself, "": Python imports it before any of its modules in any case)
    return {m: imported(p.read_text(), modules) - {m, ""} for m, p in MODULES.items()}


ALGORITHMS_LAYER = 7  # every algos.NAME (NAME without "_"), listed or not


def layers() -> dict[str, int]:
    """Module -> layer number, as docs/maintainers/layout.md's "Layers" section lists them;
    the algorithms (algos.NAME) are in ALGORITHMS_LAYER without being listed."""
    text = LAYOUT.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    placed: dict[str, int] = {}
    for number, body in re.findall(r"^### (\d+)\..*?\n(.*?)(?=^### |\Z)", text, re.M | re.S):
        for name in re.findall(r"`([\w.]+)`", body):
            assert name not in placed, f"{name} is listed in two layers"
            placed[name] = int(number)
    for module in MODULES:
        if module.startswith("algos.") and not module.split(".")[1].startswith("_"):
            placed.setdefault(module, ALGORITHMS_LAYER)
    return placed


def test_imported_reads_every_kind_of_import():
    source = (
        "from rlstore import algos, __version__\nimport rlstore.envs\n"
        "from rlstore.storage.replay import ReplayBuffer\n"
        "def f():\n    from rlstore.run import Run\n"
        "if TYPE_CHECKING:\n    from rlstore.cli import main\n"
    )
    assert imported(source, set(MODULES)) == {"algos", "", "envs", "storage.replay", "run"}


def test_every_module_has_a_layer():
    placed = layers()
    assert set(MODULES) - {""} - set(placed) == set(), "modules in no layer of layout.md"
    assert set(placed) - set(MODULES) == set(), "layout.md lists modules that do not exist"


def test_no_module_imports_a_higher_layer():
    placed = layers()
    upward = [
        f"{m} (layer {placed[m]}) imports {d} (layer {placed[d]})"
        for m, deps in graph().items()
        if m
        for d in deps
        if d and placed[d] > placed[m]
    ]
    assert upward == []


def test_the_import_graph_has_no_circle():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycle = path[path.index(d) :] + [d]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if d not in state:
                walk(d, [*path, d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            walk(m, [m])
