"""`vjob completion bash|zsh`: a shell completion script generated from the parser (shtab).

Why generated: the script then knows every command and option of this very version,
including the choices (`--rms slurm|pbs|oar`); nothing to keep in step by hand. Commands whose
extra is not installed complete by name only.
"""

from __future__ import annotations

import argparse
from typing import Any

import shtab

from vjob.cli import build_full_parser

EPILOG = """\
examples:
  vjob completion bash > /etc/bash_completion.d/vjob
  vjob completion zsh > "${fpath[1]}/_vjob"
  source <(vjob completion bash)                     this shell only"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "completion",
        help="print a bash or zsh completion script",
        description="Print a completion script for every vjob command and option, generated from the parser.",
        epilog=EPILOG,
    )
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete in")
    p.set_defaults(func=_completion)


def _completion(args: argparse.Namespace) -> int:
    print(shtab.complete(build_full_parser(), shell=args.shell), end="")
    return 0
