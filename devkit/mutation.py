"""Mutation testing of the core pure modules: does a small bug in the code make a test fail?

Why a small AST script rather than mutmut: mutmut 3 rewrites every function of the tree into
a trampoline inside a `mutants/` copy in the repository and runs the whole suite once first
(services included) to map tests to functions; here five people share the tree and two cores.
This script copies the repository once to a private directory, mutates one expression at a
time there, and runs only the few fast unit tests named for the module. A fork server keeps
the third-party imports (NumPy, SQLAlchemy, pydantic, Hypothesis, pytest) of one parent
process, so a mutant costs its tests, not an interpreter start.

The mutations (one per run; docstrings, annotations and string constants are left alone):
arithmetic operators swapped (+ -, * /, // /, % *), comparisons turned (< <=, > >=, == !=,
in / not in, is / is not), and/or swapped, `not` dropped, numbers moved by one (0 -> 1,
n -> n + 1), True/False swapped, min/max swapped, `x += y` turned into `x -= y`, a `return
EXPR` made `return None`, a subscript's constant index moved by one.

A mutant is killed when its tests fail or time out (10 x the clean run, at least 20 s);
it survives when they pass. Equivalent mutants (that no test can kill, because the program
means the same) are listed by id in a file given with `--equivalent` and counted apart:

    nice -n 19 .venv/bin/python -m devkit.mutation --module preemption/deadline/xfactor.py \\
        --tests tests/test_deadline_policies.py tests/test_pinned_mutants.py [--json out.json]

`--list` prints the mutants without running them. The last line of output is one JSON object
(module, mutants, killed, survived, equivalent, kill rate).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP_COPY = {".venv", ".git", "out", "var", ".hypothesis", ".pytest_cache", ".ruff_cache", "vjob.egg-info", "build"}

_BINOPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
}
_CMPOPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


@dataclass(frozen=True)
class Mutant:
    id: str
    """`<line>:<col>:<kind>`: stable while the line does not move."""
    line: int
    kind: str
    before: str
    after: str


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
        # an attribute docstring: a string expression right after an assignment
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                for stmt in stmts:
                    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                        out.add(id(stmt.value))
    return out


def _annotation_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = []
        if isinstance(node, ast.arg | ast.AnnAssign):
            parts.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            parts.append(node.returns)
        for part in parts:
            if part is not None:
                out.update(id(n) for n in ast.walk(part))
    return out


def _sites(tree: ast.AST) -> Iterator[tuple[ast.AST, str, object]]:
    """(node, kind, how) for every mutation of `tree`, in a stable order."""
    skip = _docstring_nodes(tree) | _annotation_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            yield node, f"binop {type(node.op).__name__}", None
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOPS:
            yield node, f"augassign {type(node.op).__name__}", None
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMPOPS:
                    yield node, f"compare {type(op).__name__}", i
        elif isinstance(node, ast.BoolOp):
            yield node, f"boolop {type(node.op).__name__}", None
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "drop not", None
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(node.value, bool):
            yield node, f"number {node.value!r}", None
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, f"bool {node.value}", None
        elif isinstance(node, ast.Name) and node.id in ("min", "max"):
            yield node, f"name {node.id}", None
        elif isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                yield node, "return None", None


def _apply(node: ast.AST, kind: str, how: object) -> None:
    """Mutate `node` in place."""
    if isinstance(node, ast.BinOp | ast.AugAssign):
        node.op = _BINOPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        assert isinstance(how, int)
        node.ops[how] = _CMPOPS[type(node.ops[how])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node, ast.UnaryOp):
        # `not x` -> `x`: replace the operator by a unary plus on bool(x)'s operand
        node.op = ast.UAdd()
        node.operand = ast.Call(func=ast.Name("bool", ast.Load()), args=[node.operand], keywords=[])
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        node.value = not node.value
    elif isinstance(node, ast.Constant):
        node.value = node.value + 1
    elif isinstance(node, ast.Name):
        node.id = "max" if node.id == "min" else "min"
    elif isinstance(node, ast.Return):
        node.value = ast.Constant(None)


def mutants(source: str) -> list[tuple[Mutant, str]]:
    """Every mutant of `source`, with the mutated module's source."""
    tree = ast.parse(source)
    out: list[tuple[Mutant, str]] = []
    sites = list(_sites(tree))
    seen: dict[str, int] = {}
    for k, (node, kind, how) in enumerate(sites):
        mutated = copy.deepcopy(tree)
        target, _, _ = list(_sites(mutated))[k]
        before = ast.unparse(target)
        _apply(target, kind, how)
        after = ast.unparse(target)
        line = getattr(node, "lineno", 0)
        col = getattr(node, "col_offset", 0)
        tag = kind.split()[0]
        key = f"{line}:{col}:{tag}{'' if how is None else how}"
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:  # nested nodes starting at one column: `a + b + c`
            key = f"{key}.{seen[key]}"
        mutant = Mutant(key, line, kind, before, after)
        out.append((mutant, ast.unparse(mutated)))
    return out


def _copy_repo(dest: Path) -> None:
    for entry in REPO.iterdir():
        if entry.name in SKIP_COPY or entry.name.startswith("mutants"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(entry, dest / entry.name)


def _run_tests(work: Path, tests: list[str], extra: list[str], timeout_s: float) -> str:
    """'passed', 'failed' or 'timeout': the tests in a forked child (imports already made)."""
    pid = os.fork()
    if pid == 0:  # the child: the mutated tree is first on the path, nothing of it imported yet
        try:
            os.chdir(work)
            sys.path[:] = [str(work), *(p for p in sys.path if p not in ("", ".", str(REPO)))]
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *extra, *tests])
            os._exit(0 if code == 0 else 1)
        except BaseException:  # noqa: BLE001 - any failure of the child is a failing run
            os._exit(1)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                pid = 0
                return "passed" if os.waitstatus_to_exitcode(status) == 0 else "failed"
            if time.monotonic() > deadline:
                return "timeout"
            time.sleep(0.02)
    finally:
        if pid:  # timed out, or we are interrupted: the child goes too
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _preimport() -> None:
    """The third-party imports every child would repeat (none of the project's own modules)."""
    import hypothesis  # noqa: F401
    import numpy  # noqa: F401
    import pydantic  # noqa: F401
    import pytest  # noqa: F401
    import sqlalchemy  # noqa: F401
    import structlog  # noqa: F401


UBIS_TESTS = [
    "tests/test_priority_kernel_checks.py",
    "tests/test_priority_shares_cap.py",
    "tests/test_priority_decay_integers.py",
    "tests/test_priority_edges.py",
    "tests/test_priority_properties.py",
    "tests/test_priority_usage.py",
]
SCHEDULING_TESTS = [
    "tests/test_pinned_mutants.py",
    "tests/test_scheduling_victims_select.py",
    "tests/test_decision_oracle.py",
    "tests/test_scheduling_victims.py",
]
CORE: dict[str, list[str]] = {
    "ubis_priority/kernel.py": UBIS_TESTS,
    "ubis_priority/terms.py": UBIS_TESTS,
    "ubis_priority/shares.py": UBIS_TESTS,
    "ubis_priority/interactive.py": UBIS_TESTS,
    "ubis_priority/decay.py": UBIS_TESTS,
    "ubis_priority/integers.py": UBIS_TESTS,
    "preemption/scheduling/guard.py": SCHEDULING_TESTS,
    "preemption/scheduling/victims.py": SCHEDULING_TESTS,
    "preemption/planner/validator.py": [
        "tests/test_pinned_mutants.py",
        "tests/test_planner_validator_rules.py",
        "tests/test_planner_paper.py",
    ],
    "preemption/deadline/xfactor.py": ["tests/test_pinned_mutants.py", "tests/test_deadline_policies.py"],
    "saline_bew/identity.py": ["tests/test_pinned_mutants.py", "tests/test_saline_identity.py"],
}
"""`--core`: the core pure modules (issue 39) and the fast unit tests each is held by."""
EQUIVALENT = Path(__file__).resolve().parent / "mutation_equivalent.txt"


def _equivalent(path: Path | None, module: Path) -> set[str]:
    out: set[str] = set()
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            word = line.split("#", 1)[0].strip()
            if word.startswith(f"{module}:"):
                out.add(word[len(str(module)) + 1 :])
    return out


def run_module(
    module: Path, tests: list[str], extra: list[str], equivalent: set[str], only: list[str] | None
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """Every mutant of `module` against `tests`, in a private copy of the repository."""
    source = (REPO / module).read_text()
    found = mutants(source)
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="vjob-mutation-") as tmp:
        work = Path(tmp)
        _copy_repo(work)
        target = work / module
        started = time.monotonic()
        clean = _run_tests(work, tests, extra, 600)
        baseline = time.monotonic() - started
        if clean != "passed":
            raise SystemExit(f"{module}: the tests fail without any mutation ({clean}): fix them first")
        timeout_s = max(20.0, 10 * baseline)
        print(f"{module}: {len(found)} mutants; clean run {baseline:.1f} s, timeout {timeout_s:.0f} s", flush=True)
        for m, mutated in found:
            if only and m.id not in only:
                continue
            target.write_text(mutated)
            outcome = "equivalent" if m.id in equivalent else _run_tests(work, tests, extra, timeout_s)
            target.write_text(source)
            results.append({**asdict(m), "outcome": outcome})
            if outcome in ("passed", "equivalent"):
                label = "SURVIVED" if outcome == "passed" else "equivalent"
                print(f"  {label:10} {m.id:24} {m.kind:20} {m.before[:60]!r} -> {m.after[:60]!r}", flush=True)
    return _summary(str(module), results), results


def _summary(name: str, results: list[dict[str, object]]) -> dict[str, object]:
    killed = sum(1 for r in results if r["outcome"] in ("failed", "timeout"))
    survived = sum(1 for r in results if r["outcome"] == "passed")
    counted = killed + survived
    return {
        "module": name,
        "mutants": len(results),
        "killed": killed,
        "survived": survived,
        "equivalent": sum(1 for r in results if r["outcome"] == "equivalent"),
        "kill_rate": round(killed / counted, 4) if counted else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--module", help="a .py file of the repository (preemption/deadline/xfactor.py)")
    parser.add_argument("--tests", nargs="+", help="the pytest arguments naming its fast tests")
    parser.add_argument("--core", action="store_true", help="every module of CORE with its tests")
    parser.add_argument(
        "--pytest-args",
        default="-m not postgres and not slurm and not realvm and not oar",
        help="extra pytest arguments (one string, split at spaces after -m's expression)",
    )
    parser.add_argument("--equivalent", type=Path, default=EQUIVALENT, help="equivalent mutant ids, one a line")
    parser.add_argument("--only", nargs="*", help="run only these mutant ids")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--json", type=Path, help="write every mutant's outcome here")
    args = parser.parse_args(argv)
    if args.core:
        plan = {Path(m): t for m, t in CORE.items()}
    elif args.module and (args.tests or args.list):
        plan = {Path(args.module): args.tests or []}
    else:
        parser.error("--core, or --module with --tests (or --list)")
    if args.list:
        for module in plan:
            found = mutants((REPO / module).read_text())
            for m, _ in found:
                print(f"{module}:{m.id:24} {m.kind:20} {m.before[:50]!r} -> {m.after[:50]!r}")
            print(json.dumps({"module": str(module), "mutants": len(found)}))
        return 0
    extra = ["-m", args.pytest_args[3:]] if args.pytest_args.startswith("-m ") else args.pytest_args.split()
    # SIGTERM unwinds like ^C: the private copy of the repository is removed, not left in /tmp.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _preimport()
    summaries: list[dict[str, object]] = []
    everything: list[dict[str, object]] = []
    for module, tests in plan.items():
        summary, results = run_module(module, tests, extra, _equivalent(args.equivalent, module), args.only)
        if len(plan) > 1:
            print(json.dumps(summary), flush=True)
        summaries.append(summary)
        everything += [{"module": str(module), **r} for r in results]
    total = _summary("total" if len(plan) > 1 else summaries[0]["module"], everything)  # type: ignore[arg-type]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": total, "modules": summaries, "mutants": everything}, indent=1))
    print(json.dumps(total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
