"""The layers of vjob, read from the code: the one table of packages and layers, the package
import graph found by walking every module's AST, and the picture in docs/architecture.png.

Why from the code: a drawing kept by hand drifts; `python -m devkit.architecture` redraws it from
what the modules really import, and tests/test_layers.py checks the same graph against LAYERS.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LAYERS: dict[str, int] = {
    "vjob": 1,
    "ubis_priority": 2,
    "provisioning": 2,
    "preemption": 3,
    "plugins": 3,
    "agent": 4,
    "pilot": 4,
    "saline_bew": 4,
    "simulator": 4,
    "devkit": 5,
}
"""Package → layer, low to high; a package imports only its own layer or below."""

LAYER_NAMES = {1: "kernel", 2: "policy / enactment", 3: "decisions / adapters", 4: "orchestrators", 5: "dev kit"}

SAME_LAYER_FORBIDDEN: frozenset[tuple[str, str]] = frozenset(
    {
        # Orchestrators stand side by side: the simulator runs without an RMS or Saline.
        ("simulator", "agent"),
        ("simulator", "saline_bew"),
        ("agent", "simulator"),
        ("agent", "saline_bew"),
        ("saline_bew", "agent"),
        ("saline_bew", "simulator"),
        # The in-job pilot is another program than the agent (pilot/__init__.py): the two share
        # only the pilot-file contract, vjob/pilot_files/.
        ("pilot", "agent"),
        ("agent", "pilot"),
        ("pilot", "simulator"),
        ("simulator", "pilot"),
        ("pilot", "saline_bew"),
        ("saline_bew", "pilot"),
        # Policies know no VM driver, and the driver no policy.
        ("ubis_priority", "provisioning"),
        ("provisioning", "ubis_priority"),
    }
)

HEAVY = ("libvirt", "ortools", "numba", "matplotlib", "optuna", "pydantic", "structlog", "sqlalchemy")
"""Optional heavy dependencies, and the three slow imports `vjob COMMAND --help` must not pay
for (the command loads its configuration and opens its store only when it runs): the only
reasons an import may sit inside a function."""


def modules(root: Path = REPO) -> list[Path]:
    return sorted(p for pkg in LAYERS for p in (root / pkg).rglob("*.py"))


def imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, top-level package, inside a function) of every project import in `path`,
    dynamic `importlib.import_module("pkg...")` with a constant name included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name.split(".")[0], inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.lineno, child.module.split(".")[0], inside))
            elif isinstance(child, ast.Call) and _is_dynamic_import(child):
                arg = child.args[0] if child.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((child.lineno, arg.value.split(".")[0], inside))
            visit(child, inside)

    visit(tree, False)
    return [(line, pkg, inside) for line, pkg, inside in found if pkg in LAYERS]


def _is_dynamic_import(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__")
    )


def violations(root: Path = REPO) -> list[str]:
    """Every import of a package above the importer's layer (or a forbidden sibling)."""
    out = []
    for path in modules(root):
        own = path.relative_to(root).parts[0]
        for line, pkg, _inside in imports(path):
            if LAYERS[pkg] > LAYERS[own] or (own, pkg) in SAME_LAYER_FORBIDDEN:
                where = f"{path.relative_to(root)}:{line}"
                out.append(f"{where}: {own} (layer {LAYERS[own]}) imports {pkg} (layer {LAYERS[pkg]})")
    return out


def graph(root: Path = REPO) -> Counter[tuple[str, str]]:
    """(importer, imported) package pairs → number of import statements."""
    edges: Counter[tuple[str, str]] = Counter()
    for path in modules(root):
        own = path.relative_to(root).parts[0]
        for _line, pkg, _inside in imports(path):
            if pkg != own:
                edges[(own, pkg)] += 1
    return edges


def draw(out: Path) -> None:
    """The layers as rows, packages as boxes, one arrow per package dependency."""
    import matplotlib  # heavy: matplotlib, only for the picture

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    rows: dict[int, list[str]] = {}
    for pkg, layer in LAYERS.items():
        rows.setdefault(layer, []).append(pkg)
    pos = {}
    for layer, pkgs in rows.items():
        for i, pkg in enumerate(pkgs):
            pos[pkg] = ((i + 1) / (len(pkgs) + 1), layer)
    fig, ax = plt.subplots(figsize=(9, 6.5))
    for (a, b), n in graph().items():
        (x1, y1), (x2, y2) = pos[a], pos[b]
        arrow = {"arrowstyle": "->", "color": "0.55", "lw": 0.6 + min(n, 40) / 20}
        ax.annotate("", xy=(x2, y2 + 0.18), xytext=(x1, y1 - 0.18), arrowprops=arrow)
    for pkg, (x, y) in pos.items():
        box = {"boxstyle": "round", "fc": "#dde8f5", "ec": "#3a5f8a"}
        ax.text(x, y, f"{pkg}/", ha="center", va="center", fontsize=11, bbox=box)
    for layer, name in LAYER_NAMES.items():
        ax.text(-0.02, layer, f"{layer} {name}", ha="right", va="center", fontsize=9, color="0.3")
    ax.set_xlim(-0.35, 1.0)
    ax.set_ylim(0.5, 5.5)
    ax.axis("off")
    ax.set_title("vjob layers (arrows: imports, width ~ count; from the code)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    bad = violations()
    for line in bad:
        print(line, file=sys.stderr)
    out = REPO / "docs" / "architecture" / "layers.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    draw(out)
    print(f"{out}: {sum(graph().values())} cross-package imports, {len(bad)} layer violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
