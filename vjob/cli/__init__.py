"""The `vjob` command: one argparse tree, one subcommand module per capability.

Why a registry of modules: each capability (priority, simulator, images, planner, RMS
adapters, best-effort wrapper) owns its subcommands in its own package, and this module only
knows their names. Exit codes are uniform: 0 success, 2 bad usage or configuration, 1 a
runtime failure; an error is one line on stderr, with the traceback only under --debug.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from vjob import __version__, log
from vjob import config as vconfig
from vjob.errors import UsageError, VjobError

# Top-level command -> (module whose `register(sub)` adds it, one-line help). Only the module of
# the command being run is imported, so `vjob db upgrade` works even when an optional
# capability's dependencies (OR-Tools, libvirt) cannot be imported on this host.
COMMANDS: dict[str, tuple[str, str]] = {
    "db": ("vjob.cli.db", "state store schema: upgrade, downgrade, current, check"),
    "config": ("vjob.cli.config_cmd", "check a configuration file, show the effective configuration"),
    "status": ("agent.status_cmd", "vjobs, VMs and recent preemptions"),
    "agent": ("agent.cli", "run the vjob agent next to an RMS"),
    "run": ("agent.run_cmd", "the in-job pilot: run this job inside a VM that survives checkpoints"),
    "prio": ("agent.prio_cmd", "UBIS priorities of pending jobs, per term (like sprio)"),
    "simulate": ("simulator.cli", "replay a workload trace under a scheduling policy"),
    "trace": ("simulator.cli", "generate and inspect workload traces"),
    "image": ("provisioning.cli", "OS image catalogue and distribution"),
    "vm": ("provisioning.cli", "inspect and operate job VMs (debugging)"),
    "plan": ("preemption.cli", "plan a cluster-wide context switch"),
    "rms": ("plugins.cli", "RMS adapter tools"),
    "besteffort": ("saline_bew.cli", "Saline best-effort jobs on OAR"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting by itself."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = _Parser(prog="vjob", description="Virtualized jobs: checkpoint and resume instead of kill.")
    parser.add_argument("--version", action="version", version=f"vjob {__version__}")
    parser.add_argument(
        "--config", metavar="FILE", help="configuration file (default $VJOB_CONFIG, /etc/vjob/vjob.toml)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = _requested_command(argv)
    every = list(dict.fromkeys(m for m, _ in COMMANDS.values()))
    modules = [COMMANDS[wanted][0]] if wanted in COMMANDS else every
    for name, (module, help_text) in COMMANDS.items():
        if module not in modules:
            sub.add_parser(name, help=help_text)  # listed in --help; its options load when it runs
    for module in modules:
        importlib.import_module(module).register(sub)
    return parser


def _requested_command(argv: Sequence[str]) -> str | None:
    """The first word of argv that names a command (skipping global options and their values)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--config":
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def load_config(args: argparse.Namespace) -> vconfig.Config:
    """The configuration named by --config / $VJOB_CONFIG, with logging set up from it."""
    cfg = vconfig.load(args.config)
    log.configure("debug" if args.debug else cfg.logging.level, cfg.logging.format)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        func: Any = getattr(args, "func", None)
        if func is None:
            parser.print_help(sys.stderr)
            return 2
        result = func(args)
        return int(result or 0)
    except VjobError as exc:
        if debug:
            traceback.print_exc()
        print(f"vjob: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("vjob: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence: one line, exit 1
        if debug:
            traceback.print_exc()
        print(f"vjob: error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
