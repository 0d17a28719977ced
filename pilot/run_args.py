"""`vjob run`'s arguments; the pilot itself is pilot.cli, imported when the command runs.

Why apart: pilot.cli imports the whole pilot (the VM driver's types, the store, the RMS
adapters' job environments, pydantic), about 0.8 s, and `vjob run --help` should cost none of
it (issue 36: every `--help` under 0.3 s).
"""

from __future__ import annotations

import argparse
from typing import Any

from plugins import RMS_PACKAGES

RUN_EPILOG = """\
examples:
  vjob run                                         in a job script: image from #VJOB os= or $VJOB_OS
  vjob run --os debian12 --script job.sh -- a b     the unchanged job.sh in a Debian guest, args a b
  vjob run --os debian-tiny --payload work.sh       the counter guest runs work.sh
  vjob run --rms pbs --memory 512 --script job.sh   under PBS, a 512 MiB guest

The job id and node come from the RMS's environment (e.g. SLURM_JOB_ID, SLURMD_NODENAME);
see docs/realjobs.md."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="the in-job pilot: run this job inside a VM that survives checkpoints",
        description="Run as a job's command inside its RMS allocation: start the job's VM (the tiny\n"
        "counter guest, or a catalogue image running the job's script unchanged), resume it from its\n"
        "snapshot after a requeue, save it when the agent checkpoints the job, and exit with the\n"
        "script's status. Normally started by the RMS hook (job_submit.lua, the PBS hook), not by hand.",
        epilog=RUN_EPILOG,
    )
    p.add_argument(
        "--rms", choices=sorted(RMS_PACKAGES), default="slurm", help="the RMS running this job (default slurm)"
    )
    p.add_argument("--job-id", metavar="ID", help="the RMS job id (default: from the job's environment)")
    p.add_argument("--node", metavar="NODE", help="the RMS node name (default: from the job's environment)")
    p.add_argument(
        "--nodes",
        metavar="NODES",
        help="a multi-node job's nodes, comma-separated (default: the job's node list: one VM per node;"
        " the counter guest is one VM unless --nodes names several)",
    )
    p.add_argument(
        "--os", metavar="IMAGE", dest="os_image", help="OS image (default: $VJOB_OS or the script's #VJOB os= line)"
    )
    p.add_argument(
        "--memory",
        type=int,
        metavar="MIB",
        help="VM memory in MiB (default: a real image gets the job's memory on the node minus [provisioning]"
        " vm_overhead_mib, or 256 where the RMS gives none; the counter guest 128, at least 72); capped by"
        " the allocation",
    )
    p.add_argument(
        "--cpus",
        type=int,
        metavar="N",
        help="a real image's vCPUs (default: the CPUs the RMS allocated on the node); capped by the allocation",
    )
    p.add_argument("--payload", metavar="FILE", help="shell script the guest runs instead of its counter")
    p.add_argument(
        "--script", metavar="FILE", help="real image: the job's script, run unchanged in the guest ('-': stdin)"
    )
    p.add_argument("--base64", action="store_true", help="the script is base64 (the Slurm wrapper's encoding)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    p.add_argument(
        "--member",
        action="store_true",
        help="a member pilot of a multi-node job, started by the first node's pilot (Slurm: srun, the leader's"
        " address and token in its environment; OAR: oarsh, one line on"
        " stdin; PBS: pbsdsh, --leader and --nonce, the token from $PBS_JOBCOOKIE)",
    )
    p.add_argument(
        "--leader", metavar="HOST:PORT", help="with --member under PBS: the leader's address (put there by its pbsdsh)"
    )
    p.add_argument(
        "--nonce", metavar="HEX", help="with --member under PBS: the nonce the job's token is derived from (not secret)"
    )
    p.add_argument(
        "--orphan-resume",
        type=float,
        default=30.0,
        metavar="S",
        help="after a save the agent asked for, resume here if not requeued within S seconds (default 30)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pilot.cli import run  # heavy: pydantic

    return run(args)
