"""The layer order of DESIGN.md, checked on the source: nothing imports a package above its own.

Why an AST walk and not only import-linter: it sees every import, at module level and inside
functions, and needs nothing installed. A function-level import is allowed only for the optional
heavy dependencies (never for a project package above the importer), so a lazy import cannot
hide an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

LAYERS: dict[str, int] = {
    "vjob": 1,
    "ubis_priority": 2,
    "provisioning": 2,
    "preemption": 3,
    "plugins": 3,
    "agent": 4,
    "saline_bew": 4,
    "simulator": 4,
    "devkit": 5,
}
"""Package → layer, low to high; a package may import its own layer or below."""

SAME_LAYER_FORBIDDEN: set[tuple[str, str]] = {
    # Orchestrators stand side by side: the simulator must not depend on the live agent or on
    # Saline (and they not on it), or the simulator could no longer run without an RMS.
    ("simulator", "agent"),
    ("simulator", "saline_bew"),
    ("agent", "simulator"),
    ("agent", "saline_bew"),
    ("saline_bew", "agent"),
    ("saline_bew", "simulator"),
    # Policies know no VM driver, and the driver no policy.
    ("ubis_priority", "provisioning"),
    ("provisioning", "ubis_priority"),
}


def _modules() -> list[Path]:
    return sorted(p for pkg in LAYERS for p in (ROOT / pkg).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every project import in `path`, wherever it sits."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value.split(".")[0]))
    return [(line, pkg) for line, pkg in found if pkg in LAYERS]


def _is_dynamic_import(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__")
    )


def violations() -> list[str]:
    out = []
    for path in _modules():
        own = path.relative_to(ROOT).parts[0]
        for line, pkg in _imports(path):
            if LAYERS[pkg] > LAYERS[own] or (own, pkg) in SAME_LAYER_FORBIDDEN:
                out.append(f"{path.relative_to(ROOT)}:{line}: {own} (layer {LAYERS[own]}) imports {pkg} "
                           f"(layer {LAYERS[pkg]})")  # fmt: skip
    return out


def test_no_package_imports_a_layer_above_it() -> None:
    assert violations() == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check itself: a lazy upward import is found (so the test above can fail)."""
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from agent.loop import Agent\n    import importlib\n"
                   "    importlib.import_module('devkit.demo')\n")  # fmt: skip
    assert _imports(src) == [(2, "agent"), (4, "devkit")]


@pytest.mark.parametrize("pkg", sorted(LAYERS))
def test_every_layer_package_exists(pkg: str) -> None:
    assert (ROOT / pkg / "__init__.py").is_file()
