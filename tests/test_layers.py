"""The layer order of DESIGN.md, checked on the source (devkit.architecture reads it).

Why an AST walk: it sees every import, at module level and inside functions, and needs nothing
installed. A function-level import of a project module is allowed only to defer an optional
heavy dependency (libvirt, ortools, numba, matplotlib), and then says so in a comment.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.architecture import HEAVY, LAYERS, REPO, imports, modules, violations


def test_no_package_imports_a_layer_above_it() -> None:
    assert violations() == []


def test_imports_inside_functions_only_defer_a_heavy_dependency() -> None:
    """Each function-level project import carries a `# heavy: <dependency>` comment."""
    bad = []
    for path in modules():
        lines = path.read_text().splitlines()
        for line, pkg, inside in imports(path):
            text = lines[line - 1] + " " + (lines[line - 2] if line > 1 else "")
            if inside and not any(f"heavy: {dep}" in text or "heavy:" in text for dep in HEAVY):
                bad.append(f"{path.relative_to(REPO)}:{line}: imports {pkg} inside a function")
    assert bad == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check itself: a lazy upward import is found (so the tests above can fail)."""
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from agent.loop import Agent\n    import importlib\n"
                   "    importlib.import_module('devkit.demo')\n")  # fmt: skip
    assert imports(src) == [(2, "agent", True), (4, "devkit", True)]


def test_every_top_level_package_has_a_layer() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "migrations", "bench"}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("pkg", sorted(LAYERS))
def test_every_layer_package_exists(pkg: str) -> None:
    assert (REPO / pkg / "__init__.py").is_file()
