"""The code's shape: modules sized by responsibility, no import cycles, each layer importing
only what it may.

Every import counts, including those inside functions and under TYPE_CHECKING: a lazy
import that closes a cycle (or reaches into a layer it must not) is still one to a reader.
Complexity per function is ruff's (C90, PLR0912, PLR0915: `make lint`); this file checks
what ruff cannot: the layers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"api": "inferq.api", "worker": "inferq.worker", "shared": "inferq.shared"}
# A soft limit: a module past it most likely holds two responsibilities (split by role, not
# to get under a number; `# fmt: skip` is no way under it either, see below).
SOFT_MAX_LINES = 500
# Declarations, one entry per thing declared: they grow with what they declare, and one
# file each is the point (settings declared once; configuration.md is generated from it).
DECLARATIONS = {"inferq.shared.settings"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    for path in sorted((ROOT / "inferq").glob("*.py")):
        if path.name != "__init__.py":
            out[f"inferq.{path.stem}"] = path
    return out


MODULES = _modules()


def _all_imports(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (and `from m import n` → m.n)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


IMPORTS = {name: _all_imports(path) for name, path in MODULES.items()}
GRAPH = {name: {m for m in found if m in MODULES and m != name} for name, found in IMPORTS.items()}


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _third_party(name: str) -> set[str]:
    """Top-level names of what `name` imports from outside inferq."""
    return {m.split(".")[0] for m in IMPORTS[name] if not m.startswith("inferq")}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_sized_by_responsibility(name: str) -> None:
    if name in DECLARATIONS:
        return
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= SOFT_MAX_LINES, (
        f"{name} has {lines} lines (> {SOFT_MAX_LINES}): does it hold two responsibilities?"
    )


def _fmt_skips_outside_tables(path: Path) -> list[int]:
    """Lines with `# fmt: skip` whose statement is not a data table (an assignment of a
    dict, list, tuple or set literal)."""
    source = path.read_text()
    lines = [n for n, text in enumerate(source.splitlines(), 1) if "# fmt: skip" in text]
    if not lines:
        return []
    tables: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        value = getattr(node, "value", None)
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
            value, ast.Dict | ast.List | ast.Tuple | ast.Set
        ):
            tables.add(node.end_lineno or node.lineno)
    return [n for n in lines if n not in tables]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_fmt_skip_only_on_data_tables(name: str) -> None:
    bad = _fmt_skips_outside_tables(MODULES[name])
    assert not bad, f"{name}: `# fmt: skip` outside a data table on lines {bad}"


def test_the_fmt_skip_check_can_fail(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("UNITS = {'a': 1,  'b': 2}  # fmt: skip\nx = f(1,  2)  # fmt: skip\n")
    assert _fmt_skips_outside_tables(f) == [2]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in `graph` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def _package(name: str) -> str:
    """The package a module sits in (a package's `__init__` is the package itself)."""
    path = MODULES[name]
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def test_no_package_cycles() -> None:
    """Packages import each other one way too (api.core ← api.webhooks, api.batches; never
    back): two packages that import each other are one package a reader must hold at once."""
    packages: dict[str, set[str]] = {}
    for name, deps in GRAPH.items():
        mine = _package(name)
        packages.setdefault(mine, set()).update(
            p for d in deps if (p := _package(d)) != mine and not _under(mine, p)
        )
    assert _cycle(packages) is None, " -> ".join(_cycle(packages) or [])


def test_the_cycle_check_can_fail() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(GRAPH[n]):
            if state.get(m) == 1:
                cycle = [*stack[stack.index(m) :], m]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)


def _violations() -> list[str]:
    out = []
    for name, deps in GRAPH.items():
        if _under(name, "inferq.shared"):
            out += [f"{name} → {d}" for d in deps if not _under(d, "inferq.shared")]
        if _under(name, "inferq.api"):
            out += [f"{name} → {d}" for d in deps if _under(d, "inferq.worker")]
        if _under(name, "inferq.worker"):
            out += [f"{name} → {d}" for d in deps if _under(d, "inferq.api")]
        # Routes are HTTP only: the app mounts them, nothing else reaches into them.
        if not (_under(name, "inferq.api.routes") or name == "inferq.api.app"):
            out += [f"{name} → {d}" for d in deps if _under(d, "inferq.api.routes")]
        # The logic the routes call, and the background subsystems, run without FastAPI.
        layers = (
            "inferq.api.core",
            "inferq.api.protocols",
            "inferq.api.batches",
            "inferq.api.webhooks",
        )
        for layer in layers:
            if _under(name, layer):
                web = _third_party(name) & {"fastapi", "starlette", "uvicorn"}
                out += [f"{name} → {w}" for w in sorted(web)]
                out += [
                    f"{name} → {d}"
                    for d in deps
                    if _under(d, "inferq.api") and not any(_under(d, ok) for ok in layers)
                ]
        # The job pipeline stands alone: the background subsystems build on it, never back.
        if _under(name, "inferq.api.core"):
            out += [
                f"{name} → {d}"
                for d in deps
                if any(
                    _under(d, p)
                    for p in ("inferq.api.webhooks", "inferq.api.batches", "inferq.api.protocols")
                )
            ]
        # The batch policy is pure: the standard library and itself only.
        if _under(name, "inferq.worker.policy"):
            outside = _third_party(name) - set(sys.stdlib_module_names) - {"__future__"}
            out += [f"{name} → {w}" for w in sorted(outside)]
            out += [f"{name} → {d}" for d in deps if not _under(d, "inferq.worker.policy")]
    return out


def test_each_layer_imports_only_what_it_may() -> None:
    """shared → shared only; api and worker never import each other; only the app imports
    routes; core, protocols, batches and webhooks never import FastAPI nor the app wiring,
    and core none of the other three; the worker's policy is the standard library only."""
    assert not _violations()


def test_the_layers_exist() -> None:
    """The rules above name real packages: a rename must move them too."""
    for package in (
        "inferq.api.routes",
        "inferq.api.core",
        "inferq.api.protocols",
        "inferq.api.batches",
        "inferq.api.webhooks",
        "inferq.worker.policy",
    ):
        assert any(_under(m, package) for m in MODULES), package
