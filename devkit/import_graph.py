"""The project's imports between modules (files), read from the code: what a module pulls in
when it is imported, whether a `# heavy:` tag on a function-level import tells the truth, and
the circles of imports inside one package.

Why module granularity next to devkit.architecture's package graph: the layers hold between
packages, but a package can still knot itself (`loop.py` imports `act.py`, which imports
`loop.py`), and a lazy import excused as heavy can defer nothing heavy. Both are read here from
the AST, as devkit.architecture reads the layers, so tests/test_layers.py holds them in CI.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from devkit.architecture import HEAVY, LAYERS, REPO, modules

_TAG = re.compile(r"#\s*heavy:\s*([A-Za-z_][\w.-]*)")


@dataclass(frozen=True)
class Import:
    """One import statement's target as the importer sees it."""

    line: int
    module: str
    """Dotted name: a project module (resolved to the file it reads) or an outside package."""
    in_function: bool
    at_import: bool
    """Runs when the importer is imported: not inside a function nor under TYPE_CHECKING."""


def module_name(path: Path, root: Path = REPO) -> str:
    """`agent/loop.py` → `agent.loop`; a package's `__init__.py` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_file(name: str, root: Path = REPO) -> Path | None:
    """The file of project module `name`, or None when it is not one."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, root: Path) -> list[str]:
    """The modules one statement imports: `from pkg import sub` names `pkg.sub` when that is
    a module of the project, else `pkg` (a name defined in it)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        found.append(sub if module_file(sub, root) is not None else base)
    return found


def module_imports(path: Path, root: Path = REPO) -> list[Import]:
    """Every import statement of `path` (functions and TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    importer = module_name(path, root)
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import | ast.ImportFrom):
                for target in _targets(child, importer, is_package, root):
                    found.append(Import(child.lineno, target, inside, not (inside or checking)))
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), inside, True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), inside, checking)
                continue
            visit(child, inside, checking)

    visit(tree, False, False)
    return found


def _parents(name: str) -> list[str]:
    """`a.b.c` → `a`, `a.b`, `a.b.c`: importing a module runs its packages' `__init__` first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def loaded_by(name: str, root: Path = REPO) -> set[str]:
    """Every module (project and outside, dotted) that importing project module `name` loads:
    its packages and what they and it import at module level, transitively."""
    seen: set[str] = set()
    todo = _parents(name)
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        path = module_file(current, root)
        if path is None:
            continue
        for imp in module_imports(path, root):
            if imp.at_import:
                todo.extend(p for p in _parents(imp.module) if p not in seen)
    return seen


def heavy_tag(path: Path, line: int) -> str | None:
    """The dependency a `# heavy: <dep>` tag names on the import at `line` or on the comment
    line just above it (a PyPI name like libvirt-python is read as its module, libvirt)."""
    lines = path.read_text().splitlines()
    text = lines[line - 1]
    above = lines[line - 2].strip() if line > 1 else ""
    match = _TAG.search(text) or (_TAG.search(above) if above.startswith("#") else None)
    if match is None:
        return None
    return match.group(1).rstrip(".,;:").removesuffix("-python")


def false_heavy_tags(root: Path = REPO) -> list[str]:
    """Each function-level project import whose `# heavy:` tag is missing, names a dependency
    not in HEAVY, or names one that importing the module does not load."""
    bad: list[str] = []
    cache: dict[str, set[str]] = {}
    for path in modules(root):
        for imp in dict.fromkeys(module_imports(path, root)):  # `from m import a, b`: one check
            if not imp.in_function or imp.module.split(".")[0] not in LAYERS:
                continue
            where = f"{path.relative_to(root)}:{imp.line}: {imp.module}"
            dep = heavy_tag(path, imp.line)
            if dep is None:
                bad.append(f"{where}: imported inside a function without a `# heavy: <dependency>` tag")
            elif dep not in HEAVY:
                bad.append(f"{where}: `heavy: {dep}` is not one of {', '.join(HEAVY)}")
            else:
                if imp.module not in cache:
                    cache[imp.module] = {m.split(".")[0] for m in loaded_by(imp.module, root)}
                if dep not in cache[imp.module]:
                    bad.append(f"{where}: tagged `heavy: {dep}`, but importing it does not load {dep}")
    return bad


def package_graph(package: str, root: Path = REPO) -> dict[str, set[str]]:
    """Module → the modules of the same top-level package it imports (anywhere in it)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        graph.setdefault(name, set())
        for imp in module_imports(path, root):
            if imp.module.split(".")[0] == package and imp.module != name and module_file(imp.module, root):
                graph[name].add(imp.module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def package_circles(root: Path = REPO) -> list[str]:
    """One line per circle of imports inside a package of LAYERS."""
    return [" <-> ".join(c) for pkg in LAYERS if (root / pkg).is_dir() for c in circles(package_graph(pkg, root))]
