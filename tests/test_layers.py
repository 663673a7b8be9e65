"""The architecture as the package READMEs state it, checked on the source: no import circle,
every import points down (planner <- fxglue bridge <- fxglue.run <- bucketplan, the application;
fxglue.models below the bridge; inside planner, core <- cost <- rules <- search <- jobs), the
rooms are folders (planner/ keeps at most 8 files at its top, each room says in its first
docstring line what lives there), and no function over 80 lines (planner, fxglue and bucketplan;
experiments and tests are not scanned)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bucketplan", "planner", "fxglue")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, module_level: bool) -> set[str]:
    """Project modules ``path`` imports (at module level only, or anywhere)."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in ast.walk(tree)] if not module_level else [
        n for top in tree.body for n in ([top] if not isinstance(top, (ast.If, ast.Try)) else ast.walk(top))]
    found = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            found |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            found.add(n.module)
            found |= {f"{n.module}.{a.name}" for a in n.names}  # `from fxglue.models import parallel`
    return found


def _graph(module_level: bool) -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i in _imports(p, module_level) if i in mods and i != m} for m, p in mods.items()}


def test_no_import_circle_at_module_level():
    graph = _graph(module_level=True)
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _room(m: str) -> str:
    if m.startswith("planner"):
        return "planner"
    if m.startswith("fxglue.models"):
        return "models"
    if m.startswith("fxglue.run"):
        return "run"
    if m.startswith("bucketplan"):
        return "app"
    return "bridge"


# what each room may import (anywhere in a module, lazy imports included)
ALLOWED = {"planner": {"planner"}, "models": {"models"}, "bridge": {"planner", "models", "bridge"},
           "run": {"planner", "models", "bridge", "run"},
           "app": {"planner", "models", "bridge", "run", "app"}}


def test_every_import_points_down_the_layers():
    wrong = [f"{m} imports {n}" for m, deps in _graph(module_level=False).items() for n in deps
             if _room(n) not in ALLOWED[_room(m)] and n != "fxglue"]
    assert not wrong, wrong


# planner's rooms, lowest first: a room imports only itself and the rooms before it
PLANNER_ROOMS = ("core", "cost", "rules", "search", "jobs")


def test_planner_rooms_import_only_downwards():
    def room(m: str) -> int | None:
        parts = m.split(".")
        return PLANNER_ROOMS.index(parts[1]) if len(parts) > 1 and parts[1] in PLANNER_ROOMS else None

    graph = _graph(module_level=False)
    assert set(PLANNER_ROOMS) == {p.name for p in (ROOT / "planner").iterdir() if (p / "__init__.py").exists()}
    stray = [m for m in graph if m.startswith("planner.") and room(m) is None]
    assert not stray, f"planner modules outside a room: {stray}"
    up = [f"{m} imports {n}" for m, deps in graph.items() if m.startswith("planner.") for n in deps
          if n.startswith("planner.") and room(n) > room(m)]
    assert not up, up


def test_planner_top_is_a_map_of_rooms():
    top = [p.name for p in (ROOT / "planner").iterdir() if p.is_file()]
    assert len(top) <= 8, top
    for name in PLANNER_ROOMS:
        doc = ast.get_docstring(ast.parse((ROOT / "planner" / name / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, f"planner/{name}: its first docstring line says what lives there"


def test_planner_never_imports_torch_or_fxglue():
    for m, path in _modules().items():
        if m.startswith("planner"):
            bad = {i for i in _imports(path, module_level=False) if i.split(".")[0] in ("torch", "fxglue")}
            assert not bad, f"{m}: {bad}"


def test_planner_and_fxglue_never_import_the_application():
    for m, path in _modules().items():
        if not m.startswith("bucketplan"):
            bad = {i for i in _imports(path, module_level=False) if i.split(".")[0] == "bucketplan"}
            assert not bad, f"{m}: {bad}"


def test_no_two_modules_import_each_other_even_lazily():
    """A lazy import inside a function is still a dependency: solve and repair once needed one."""
    graph = _graph(module_level=False)
    pairs = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps if a in graph.get(b, ())})
    assert not pairs, pairs


MAX_FUNCTION_LINES = 80  # issue 26: "no function over 80 lines" (a longer one reads as several)


def test_no_function_is_over_80_lines():
    long = [f"{path.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for path in _modules().values() for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long


MAX_KEYWORDS = 6  # issue 44: a longer list is an options object (planner.core.options) waiting to be named


def test_no_public_function_takes_more_than_6_keyword_arguments():
    """Public: a module-level function or a public class's method whose name has no leading
    underscore. Keyword arguments: those with a default and the keyword-only ones."""
    long = []
    for path in _modules().values():
        tree = ast.parse(path.read_text())
        for top in tree.body:
            if isinstance(top, ast.ClassDef) and not top.name.startswith("_"):
                functions = [n for n in top.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            else:
                functions = [top] if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
            for f in functions:
                keywords = len(f.args.kwonlyargs) + len(f.args.defaults)
                if not f.name.startswith("_") and keywords > MAX_KEYWORDS:
                    long.append(f"{path.relative_to(ROOT)}:{f.lineno} {f.name} ({keywords})")
    assert not long, long


def test_no_private_name_crosses_a_module_boundary_in_planner():
    """What one module of planner/ takes from another is public: a ``_name`` imported from
    another module (``from planner.x import _y``) or read off one (``x._y``) is a helper that
    wants a public home (issue 60)."""
    crossing = []
    for module, path in _modules().items():
        if not module.startswith("planner"):
            continue
        tree = ast.parse(path.read_text())
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                     and (n.module or "").startswith("planner") for a in n.names}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("planner"):
                crossing += [f"{module}: from {n.module} import {a.name}" for a in n.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in imported \
                    and n.attr.startswith("_") and not n.attr.startswith("__"):
                crossing.append(f"{module}:{n.lineno} {n.value.id}.{n.attr}")
    assert not crossing, crossing
