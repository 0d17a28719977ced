"""The `vjob` command: one argparse tree, one subcommand module per capability.

Why a registry of modules: each capability (priority, simulator, images, planner, RMS
adapters, best-effort wrapper) owns its subcommands in its own package, and this module only
knows their names. `vjob --help` lists the commands from this registry without importing any
of them (fast, and it works on a base install without the heavy extras); only the module of the
command being run is imported. Exit codes are uniform: 0 success, 2 bad usage, bad
configuration or a missing extra, 1 a runtime failure; an error is one line on stderr, with the
traceback only under --debug. The global options `--config` and `--debug` are accepted
anywhere on the line (every parser of the tree carries them).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vjob import __version__
from vjob.errors import UsageError, VjobError

if TYPE_CHECKING:
    from vjob import config as vconfig


@dataclass(frozen=True)
class Command:
    """One top-level command: where it lives, its one-line help, the extra it needs."""

    module: str
    """The module whose `register(sub)` adds it (imported only when the command runs)."""
    help: str
    extra: str | None = None
    """The pip extra (setup.cfg) without which the command cannot run; None: the base install."""


COMMANDS: dict[str, Command] = {
    "db": Command("vjob.cli.db", "state store schema: upgrade, downgrade, current, check"),
    "config": Command("vjob.cli.config_cmd", "check a configuration file, show the effective configuration"),
    "schema": Command("preemption.cli", "print the JSON Schema of a JSON input (cluster view, instance, plan)"),
    "completion": Command("vjob.cli.completion", "print a bash or zsh completion script"),
    "status": Command("agent.status_cmd", "vjobs, VMs and recent preemptions"),
    "agent": Command("agent.cli", "run the vjob agent next to an RMS (observe, decide, act)"),
    "drain": Command("agent.drain_cmd", "stop preempting, release checkpointed jobs, reset priorities (--undo)"),
    "uninstall": Command("agent.uninstall_cmd", "remove what vjob deploy installed, the VMs and runtime files"),
    "run": Command("pilot.run_args", "the in-job pilot: run this job inside a VM that survives checkpoints", "vm"),
    "prio": Command("agent.prio_cmd", "UBIS priorities of pending jobs, per term (like sprio)"),
    "simulate": Command("simulator.cli_args", "replay a workload trace under a scheduling policy", "sim"),
    "trace": Command("simulator.cli_args", "generate and inspect workload traces", "sim"),
    "tune": Command("simulator.tune.cli", "find the weights for a site's workload (multi-objective search)", "tune"),
    "image": Command("provisioning.cli", "OS image catalogue and distribution", "vm"),
    "vm": Command("provisioning.cli", "inspect and operate job VMs (debugging)", "vm"),
    "plan": Command("preemption.cli", "plan a cluster-wide context switch (CP-SAT needs the planner extra)"),
    "rms": Command("plugins.cli", "RMS adapter tools: parse a recorded RMS output"),
    "deploy": Command("plugins.cli", "list and install the files an operator deploys (units, hooks, examples)"),
    "node-service": Command("plugins.node_service_cmd", "the root-side service on each compute node, for job pilots"),
    "besteffort": Command("saline_bew.cli_args", "Saline best-effort jobs on OAR"),
    "oar": Command("saline_bew.oar_cmd", "OAR integration: vjob's admission rule (install-rules, uninstall-rules)"),
}

EXTRAS: dict[str, tuple[str, str]] = {
    "libvirt": ("vm", "libvirt-python"),
    "ortools": ("planner", "ortools"),
    "numba": ("sim", "numba"),
    "llvmlite": ("sim", "numba"),
    "matplotlib": ("sim", "matplotlib"),
    "optuna": ("tune", "optuna"),
    "argparse_manpage": ("dev", "argparse-manpage"),
    "bcrypt": ("exporter", "bcrypt"),
    "yaml": ("exporter", "PyYAML"),
}
"""Top-level module of an optional dependency → (the extra that installs it, its PyPI name)."""


class MissingExtraError(UsageError):
    """A command needs an optional dependency this installation lacks (exit 2, one line)."""

    def __init__(self, what: str, module: str) -> None:
        extra, dist = EXTRAS.get(module, ("all", module))
        super().__init__(f"{what} needs {dist}, which is not installed: {_pip()} install 'vjob[{extra}]'")


def _pip() -> str:
    """The pip of this vjob's environment (/opt/vjob/bin/pip in the operator's guide), which
    keeps the installed vjob and adds the extra's packages; `pip` when there is none beside."""
    beside = Path(sys.executable).with_name("pip")
    return str(beside) if beside.is_file() else "pip"


def require_extra(what: str, *modules: str) -> None:
    """Fail at the start of `what` (a command) with the extra to install when one of `modules`
    cannot be imported, instead of a traceback half-way through the work."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MissingExtraError(what, name.split(".")[0]) from None


def missing_extra(exc: ImportError) -> str | None:
    """The optional dependency whose absence `exc` reports, or None when it is not one."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    return name if name in EXTRAS else None


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse sizes the help column without the extra indent of a subcommand's name, so a
    name of 12 characters or more (`node-service`) had its help pushed to the next line."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction) and action.help is not argparse.SUPPRESS:
            longest = max((len(name) for name in action.choices), default=0)
            self._action_max_length = max(self._action_max_length, longest + self._current_indent + 2)


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting by itself, and
    gives every (sub)command the global options so they are accepted anywhere on the line."""

    def __init__(self, *args: Any, global_defaults: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)
        # In a subcommand the defaults are SUPPRESS, so an option given before the command is
        # not reset by the subparser that does not see it.
        default: dict[str, Any] = {} if global_defaults else {"default": argparse.SUPPRESS}
        group = self.add_argument_group("global options")
        group.add_argument(
            "--config",
            metavar="FILE",
            help="configuration file (default $VJOB_CONFIG, then /etc/vjob/vjob.toml, then built-in defaults)",
            **default,
        )
        group.add_argument("--debug", action="store_true", help="show tracebacks and debug logs", **default)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse checks the required arguments before it looks at the words it does not know,
        so a typo (`--node` for `--nodes`) was reported as a missing option: name the typo."""
        try:
            return super().parse_known_args(args, namespace)
        except UsageError as exc:
            message = str(exc)  # also "one of the arguments --from --rms is required"
            if not message.startswith(f"{self.prog}: ") or "required" not in message:
                raise
            unknown = self._unknown_options(list(sys.argv[1:] if args is None else args))
            if not unknown:
                raise
            raise UsageError(f"{self.prog}: unrecognized arguments: {' '.join(unknown)}") from None

    def _unknown_options(self, words: list[str]) -> list[str]:
        """The words of `words` that look like an option of no action here (nor a prefix of one)."""
        known = self._option_string_actions
        unknown = []
        for word in words:
            if word == "--":
                break
            name = word.split("=", 1)[0]
            short = not word.startswith("--") and word[:2] in known  # -ofile: -o with its value
            if word.startswith("-") and not word[1:2].isdigit() and not short:
                if not any(o.startswith(name) for o in known):
                    unknown.append(word)
        return unknown


EPILOG = """\
examples:
  vjob config check /etc/vjob/vjob.toml     check a configuration file
  vjob agent --dry-run --once               one tick: log what the agent would do, change nothing
  vjob deploy list                          the files an operator installs
  vjob prio --rms slurm                     UBIS priorities of the pending jobs
  vjob COMMAND --help                       a command's options and examples

Exit codes: 0 success, 2 bad usage, configuration or a missing extra, 1 runtime failure.
Documentation: docs/operator.md (install, extras, units, metrics), docs/configuration.md."""


def _top_parser() -> tuple[_Parser, Any]:
    parser = _Parser(
        prog="vjob",
        description="Virtualized jobs: checkpoint and resume batch jobs instead of killing them.",
        epilog=EPILOG,
        global_defaults=True,
    )
    parser.add_argument("--version", action="version", version=f"vjob {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    return parser, sub


def _listed_help(cmd: Command) -> str:
    return f"{cmd.help} [extra: {cmd.extra}]" if cmd.extra else cmd.help


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: the requested command's module only; the others as names."""
    parser, sub = _top_parser()
    wanted = _requested_command(argv)
    module = COMMANDS[wanted].module if wanted in COMMANDS else None
    for name, cmd in COMMANDS.items():
        if cmd.module != module:
            sub.add_parser(name, help=_listed_help(cmd))  # listed in --help; its options load when it runs
    if module is not None:
        try:
            importlib.import_module(module).register(sub)
        except ImportError as exc:
            heavy = missing_extra(exc)
            if heavy is None:
                raise
            raise MissingExtraError(f"vjob {wanted}", heavy) from None
    return parser


def build_full_parser(*, strict: bool = False) -> argparse.ArgumentParser:
    """Every command's parser (for shell completion, man pages and the help test). A command
    whose module cannot be imported for a missing extra is listed with its one-line help only,
    unless `strict`."""
    parser, sub = _top_parser()
    done: set[str] = set()
    for name, cmd in COMMANDS.items():
        if cmd.module in done:
            continue
        try:
            importlib.import_module(cmd.module).register(sub)
            done.add(cmd.module)
        except ImportError as exc:
            if strict or missing_extra(exc) is None:
                raise
            sub.add_parser(name, help=_listed_help(cmd))
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
    # Imported here, not at the top, so that `vjob --help` stays under 0.3 s.
    from vjob import config as vconfig  # heavy: pydantic
    from vjob import log  # heavy: structlog

    cfg = vconfig.load(getattr(args, "config", None))
    log.configure("debug" if getattr(args, "debug", False) else cfg.logging.level, cfg.logging.format)
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
        try:
            result = func(args)
        except ImportError as exc:
            heavy = missing_extra(exc)
            if heavy is None:
                raise
            raise MissingExtraError(f"vjob {args.command}", heavy) from exc
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
