"""The shape issue 22 asked for, kept by tests: imports point only downward through the layers
of docs/architecture.md (a module imports only modules of its own layer or of a layer listed
above it), every module is listed there, there is no import circle, no module is over 500
lines and no function over 60 (docstrings count)."""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "epochstream"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """``{dotted name: (path, is a package's __init__)}`` of every module of the library."""
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if pkg else parts)] = (p, pkg)
    return out


def _layers() -> dict[str, int]:
    """``{dotted module name: layer index}`` from the table of docs/architecture.md: a row whose
    first cell is not empty starts the next layer; every backquoted path in the second cell is
    one of its modules (a folder ``x/``: every module in it)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("## Layers and modules", 1)[1].split("\n## ", 1)[0]
    layer, out = -1, {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[0]) <= set("-:") and cells[0] or cells[1] == "module":
            continue
        if cells[0]:
            layer += 1
        for path in re.findall(r"`([^`]+)`", cells[1]):
            name = "epochstream." + path.removesuffix(".py").rstrip("/").replace("/", ".")
            out[name] = layer
    return out


def _layer_of(name: str, layers: dict[str, int]) -> int | None:
    while name:
        if name in layers:
            return layers[name]
        name = name.rpartition(".")[0]
    return None


def _imports(name: str, path: pathlib.Path, pkg: bool, modules: dict) -> list[tuple[str, int]]:
    """``[(imported module, line)]`` of every import of the library's modules in ``path``
    (at module level and inside functions alike)."""
    base = name.split(".") if pkg else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                stem = base[:len(base) - node.level + 1]
                target = ".".join(stem + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "epochstream":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                out.append((full if full in modules else target, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names
                    if a.name.split(".")[0] == "epochstream"]
    return out


# the package roots and entry points: not modules of a layer
_UNLAYERED = {"epochstream", "epochstream.__main__"}


def test_every_module_is_in_the_architecture_table():
    layers, modules = _layers(), _modules()
    missing = [m for m, (_, pkg) in modules.items()
               if m not in _UNLAYERED and not pkg and _layer_of(m, layers) is None]
    assert not missing, f"modules docs/architecture.md does not list: {missing}"


def test_every_import_of_the_library_resolves():
    """Every import of the library's own modules (at module level or inside a function, where
    only running that code would find a broken one) names a module that exists."""
    modules = _modules()
    broken = [f"{path.relative_to(ROOT)}:{line} imports {target}"
              for name, (path, pkg) in modules.items()
              for target, line in _imports(name, path, pkg, modules) if target not in modules]
    assert not broken, "\n".join(broken)


def test_imports_point_only_downward_through_the_layers():
    layers, modules = _layers(), _modules()
    upward = []
    for name, (path, pkg) in modules.items():
        mine = _layer_of(name, layers)
        if mine is None:
            continue
        for target, line in _imports(name, path, pkg, modules):
            theirs = _layer_of(target, layers)
            if pkg and target.startswith(name + "."):
                continue  # a package re-exporting its own modules
            if theirs is not None and theirs > mine:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "imports running back up:\n" + "\n".join(upward)


def test_no_import_circle():
    modules = _modules()
    graph = {n: {t for t, _ in _imports(n, p, pkg, modules) if t in modules and t != n}
             for n, (p, pkg) in modules.items()}
    for n, (_, pkg) in modules.items():  # a package's __init__ is not part of its children
        if pkg:
            graph[n] = {t for t in graph[n] if not t.startswith(n + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_no_module_over_500_lines_and_no_function_over_60():
    too_long = []
    for name, (path, _) in _modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n}")
    assert not too_long, "\n".join(too_long)
