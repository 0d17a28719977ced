"""The layer order of DESIGN.md, checked on the source (devkit.architecture and
devkit.import_graph read it).

Why an AST walk: it sees every import, at module level and inside functions, and needs nothing
installed. A function-level import of a project module is allowed only to defer an optional
heavy dependency (HEAVY: libvirt, ortools, numba, matplotlib, optuna, and pydantic and structlog
for `vjob --help`), and then says which in a `# heavy: <dependency>` tag on its line or on a
comment line just above it. The tag must be true: importing the module must load that
dependency, directly or through the project modules it imports at module level, transitively
(its packages' `__init__` included; imports inside functions or under TYPE_CHECKING do not run
at import, so they do not count). A PyPI name (libvirt-python) is read as its module (libvirt).

Inside one top-level package no modules may import each other in a circle. Every import
statement draws the arrow, at module level, inside a function or under TYPE_CHECKING alike (each
is a dependency a reader must follow, as farm-studio draws them), with module granularity:
`from pkg import name` points at `pkg/name.py` when that is a module, else at `pkg/__init__.py`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.architecture import LAYERS, REPO, imports, violations
from devkit.import_graph import circles, false_heavy_tags, package_circles, package_graph


def test_no_package_imports_a_layer_above_it() -> None:
    assert violations() == []


def test_imports_inside_functions_only_defer_a_heavy_dependency() -> None:
    """Each function-level project import carries a true `# heavy: <dependency>` tag."""
    assert false_heavy_tags() == []


def test_no_circle_of_imports_inside_a_package() -> None:
    assert package_circles() == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check itself: a lazy upward import is found (so the tests above can fail)."""
    src = tmp_path / "mod.py"
    src.write_text(
        "def f():\n    from agent.loop import Agent\n    import importlib\n    importlib.import_module('devkit.demo')\n"
    )
    assert imports(src) == [(2, "agent", True), (4, "devkit", True)]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_tag_check_refuses_a_false_or_missing_tag(tmp_path: Path) -> None:
    """The check itself: a tag naming a dependency the module does not load, a dependency
    outside HEAVY, or no tag at all is refused; true tags, direct or transitive, pass."""
    root = _tree(
        tmp_path,
        {
            "vjob/__init__.py": "",
            "vjob/light.py": "import json\n",
            "vjob/heavy.py": "import pydantic\n",
            "vjob/through.py": "from vjob import heavy\n",
            "vjob/hidden.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pydantic\n",
            "vjob/user.py": (
                "def f():\n"
                "    from vjob.heavy import x  # heavy: pydantic\n"
                "    # heavy: pydantic, through vjob.heavy\n"
                "    from vjob.through import y\n"
                "    from vjob.light import z  # heavy: pydantic\n"
                "    from vjob.light import w  # heavy: requests\n"
                "    from vjob.light import v\n"
                "    from vjob import hidden  # heavy: pydantic\n"
            ),
        },
    )
    assert [line.split(": ")[0] for line in false_heavy_tags(root)] == [
        "vjob/user.py:5",
        "vjob/user.py:6",
        "vjob/user.py:7",
        "vjob/user.py:8",
    ]


def test_the_circle_check_finds_a_planted_circle(tmp_path: Path) -> None:
    """The check itself: a circle through a function-level and a TYPE_CHECKING import is found,
    a chain is not, and the other package's modules stay out of it."""
    root = _tree(
        tmp_path,
        {
            "agent/__init__.py": "",
            "agent/a.py": "from agent import b\nimport vjob.x\n",
            "agent/b.py": "def f():\n    from agent.c import g\n",
            "agent/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agent.a import A\n",
            "agent/d.py": "from agent import a\n",
            "vjob/__init__.py": "",
            "vjob/x.py": "from agent import d\n",
        },
    )
    assert package_graph("agent", root)["agent.a"] == {"agent.b"}
    assert package_circles(root) == ["agent.a <-> agent.b <-> agent.c"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_every_top_level_package_has_a_layer() -> None:
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests", "migrations", "bench"}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("pkg", sorted(LAYERS))
def test_every_layer_package_exists(pkg: str) -> None:
    assert (REPO / pkg / "__init__.py").is_file()
