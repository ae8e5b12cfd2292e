"""The tree's contracts that import-linter (pyproject's `[tool.importlinter]`, run by
scripts/test) does not check: every module imports alone, and no two modules import each other,
`TYPE_CHECKING` imports included (docs/adr/0014-a-tree-by-layer.md)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vqueues", "clients/python/vqueues_client")


def _modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        base = ROOT / top
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base.parent).with_suffix("")
            name = ".".join(rel.parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules `module` imports, at any depth of its code."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and known[name].name != "__init__.py":
                out.add(name)
    return out


def test_no_two_modules_import_each_other_even_for_types():
    known = _modules()
    graph = {m: _imports(m, p, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while True:
                n = stack.pop()
                group.append(n)
                if n == m:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for m in graph:
        if m not in index:
            visit(m)
    assert cycles == []


def test_every_module_imports_alone():
    """Each module in a fresh set of modules: no import works only because another module
    happened to be imported first."""
    names = [m for m in _modules() if not m.endswith("__main__")]
    code = (
        "import importlib, sys\n"
        "failed = []\n"
        f"for name in {names!r}:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] in "
        "('vqueues', 'vqueues_client')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {exc!r}')\n"
        "print('\\n'.join(failed))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
