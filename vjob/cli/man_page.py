"""vjob(1), written from the command line's own parsers, so the page cannot drift from the code.

Why not argparse-manpage (the `dev` extra): an operator's install has no dev tools, `vjob
deploy install man-page` must work there, and that tool writes neither the examples every
command carries in its epilog nor the EXIT STATUS, ENVIRONMENT and FILES sections an operator
looks for. The units' `Documentation=man:vjob(1)` points here (systemd-analyze verify checks it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Iterable, Iterator

EXIT_STATUS = (
    ("0", "success (for `vjob db check`, `vjob config check`: the thing checked is right)"),
    (
        "1",
        "a runtime failure: the store or an RMS unreachable, a command that failed, a refused "
        "operation; the one line on standard error says which",
    ),
    (
        "2",
        "bad usage or bad input: an unknown option, an invalid configuration key or value, a "
        "malformed file; the line names the field and the value",
    ),
    ("130", "interrupted (SIGINT)"),
)

ENVIRONMENT = (
    ("VJOB_CONFIG", "the configuration file when --config is not given (else /etc/vjob/vjob.toml)"),
    ("VJOB_DATA_DIR", "the data directory when data_dir is empty in the configuration"),
    ("VJOB_OS", "vjob run: the OS image when --os is not given (also read by the PBS filter)"),
    ("VJOB_CLASS, VJOB_DEADLINE", "PBS: the job's class and deadline, passed with qsub -v"),
    ("VJOB_SALINE_SOCKET", "the Saline manager's socket for vjob besteffort"),
    ("VJOB_CACHE_DIR", "where guest kernels and packages are cached (/var/cache/vjob as root, else ~/.cache/vjob)"),
    ("SLURM_JOB_ID, PBS_JOBID, OAR_JOB_ID", "vjob run inside a job: which job, and its allocation"),
)

FILES = (
    ("/etc/vjob/vjob.toml", "the configuration (vjob config reference lists every key)"),
    ("/var/lib/vjob", "root's data directory: vjob.sqlite (the store), images/, snapshots/, vms/, pilots/"),
    ("~/.local/share/vjob", "an ordinary user's data directory"),
    ("/run/vjob/node.sock", "the node service's socket ([node] socket)"),
    ("/etc/systemd/system/vjob-*.service", "the agent, node service and Saline units (vjob deploy)"),
)


def _text(value: str) -> str:
    """Roff-safe text: backslashes escaped, a line never starting as a request."""
    value = value.replace("\\", "\\e")
    value = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in value)  # groff's Unicode escape
    return "\n".join(("\\&" + line) if line[:1] in (".", "'") else line for line in value.splitlines())


def _flag(value: str) -> str:
    return _text(value).replace("-", "\\-")


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:  # type: ignore[type-arg]
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


GLOBAL = frozenset({"--config", "--debug"})
"""Options every command accepts: described once, under OPTIONS."""


def _options(parser: argparse.ArgumentParser, *, top: bool = False) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if not top and GLOBAL.intersection(action.option_strings):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = str(action.metavar or action.dest)
        yield f".TP\n.B {_flag(name)}\n{_text(action.help or '')}"


def _examples(epilog: str | None) -> str:
    if not epilog or "example" not in epilog.lower():
        return ""
    return f".PP\n.nf\n{_text(epilog.strip())}\n.fi"


def _command(path: str, parser: argparse.ArgumentParser, depth: int, shown: str | None = None) -> Iterator[str]:
    """One command's section; `shown`: the examples its parent prints (many actions share
    their command's epilog: printed once, after the actions)."""
    yield f'.SS "{_text(path)}"'
    if parser.description:
        yield _text(re.sub(r"\s+", " ", parser.description).strip())
    yield from _options(parser)
    sub = _subparsers(parser)
    if sub is not None and depth < 3:
        seen: set[int] = set()
        for name, child in sub.choices.items():
            if id(child) not in seen:  # an alias names the same parser
                seen.add(id(child))
                yield from _command(f"{path} {name}", child, depth + 1, parser.epilog)
    if parser.epilog != shown:
        examples = _examples(parser.epilog)
        if examples:
            yield examples


def _table(rows: Iterable[tuple[str, str]], *, bold: bool = True) -> str:
    return "\n".join(f".TP\n{'.B ' if bold else ''}{_text(k)}\n{_text(v)}" for k, v in rows)


def render(parser: argparse.ArgumentParser, version: str, date: dt.date | None = None) -> str:
    """The whole page for `parser` (vjob.cli.build_full_parser()), in man(7) roff."""
    day = (date or dt.date.today()).isoformat()
    out = [
        f'.TH VJOB 1 "{day}" "vjob {_text(version)}" "vjob manual"',
        ".SH NAME",
        "vjob \\- run batch jobs in virtual machines that are checkpointed and resumed, not killed",
        ".SH SYNOPSIS",
        ".B vjob\n[\\fB\\-\\-config\\fR \\fIFILE\\fR] [\\fB\\-\\-debug\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR...]",
        ".SH DESCRIPTION",
        _text(re.sub(r"\s+", " ", parser.description or "").strip()),
        ".PP",
        "Users keep submitting with sbatch, qsub or oarsub; the RMS hooks make a job a vjob, the agent "
        "orders the queue and checkpoints victims for interactive jobs, and the pilot (\\fBvjob run\\fR) "
        "runs the job's script in its VMs.",
        ".SH OPTIONS",
        *_options(parser, top=True),
        ".SH COMMANDS",
    ]
    sub = _subparsers(parser)
    for name, child in sub.choices.items() if sub is not None else ():
        out.extend(_command(f"vjob {name}", child, 1))
    out += [
        ".SH EXIT STATUS",
        _table(EXIT_STATUS),
        ".SH ENVIRONMENT",
        _table(ENVIRONMENT),
        ".SH FILES",
        _table(FILES),
        ".SH SEE ALSO",
        "\\fBsbatch\\fR(1), \\fBqsub\\fR(1), \\fBoarsub\\fR(1), \\fBsystemctl\\fR(1), "
        "\\fBvirsh\\fR(1); the guides under docs/ in vjob's source (operator.md first).",
    ]
    return "\n".join(part for part in out if part) + "\n"
