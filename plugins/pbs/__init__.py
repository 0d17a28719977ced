"""Torque and OpenPBS / PBS Pro: the adapter the agent drives, the recorded-output parser, and
the files an operator installs (the Torque submit filter and the OpenPBS hook, beside this
file, installed as described in deploy/pbs/README.md).
"""

from __future__ import annotations

from plugins.pbs.adapter import ENVIRONMENT, PbsAdapter, make_adapter
from plugins.pbs.parse import parse_jobs, parse_nodes, parse_output

__all__ = ["ENVIRONMENT", "PbsAdapter", "make_adapter", "parse_jobs", "parse_nodes", "parse_output"]
