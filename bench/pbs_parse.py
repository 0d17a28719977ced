"""How long the PBS adapter takes to read a large queue, per output format, on the same jobs.

The 121 recorded KU Leuven `qstat -f` jobs are replicated (fresh ids) into a queue of N jobs
and written in the three forms the adapter reads — Torque text (`qstat -f`), Torque XML
(`qstat -x`) and OpenPBS JSON (`qstat -f -F json`) — so the formats are compared on identical
content in one run. Times are CPU seconds of this (single-threaded) process, so that other work
on a shared machine does not count. Printed: CPU milliseconds per 1,000 jobs for each format, and the ratios
text/XML and JSON/XML (what `[pbs] torque_format = "text"` costs an agent tick). The last line
is one JSON object.

    .venv/bin/python bench/pbs_parse.py [--jobs 4840] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import track
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugins.pbs.parse import parse_jobs  # noqa: E402
from plugins.pbs.records import Record, pbs_text_jobs  # noqa: E402

FIXTURE = ROOT / "tests" / "data" / "fixtures" / "torque" / "vsc_qstat_full.txt"


def replicate(text: str, total: int) -> tuple[str, list[Record]]:
    """`total` jobs in qstat -f text (the recorded blocks with fresh ids) and their records."""
    blocks = [b for b in text.split("\nJob Id: ") if b.strip()]
    blocks = [b.removeprefix("Job Id: ") for b in blocks]
    out = []
    for i in range(total):
        block = blocks[i % len(blocks)]
        job_id, rest = block.split("\n", 1)
        out.append(f"Job Id: {i + 1}.{job_id.split('.', 1)[1]}\n{rest.rstrip()}\n")
    joined = "\n".join(out)
    return joined, pbs_text_jobs(joined, source="bench")


def to_xml(records: list[Record]) -> str:
    root = ET.Element("Data")
    for record in records:
        job = ET.SubElement(root, "Job")
        groups: dict[str, ET.Element] = {}
        for key, value in record.items():
            text = ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value)
            if "." in key and key.split(".", 1)[0] in ("Resource_List", "resources_used"):
                head, tail = key.split(".", 1)
                if head not in groups:
                    groups[head] = ET.SubElement(job, head)
                ET.SubElement(groups[head], tail).text = text
            else:
                ET.SubElement(job, key.replace(".", "_")).text = text
    return ET.tostring(root, encoding="unicode")


def to_json(records: list[Record]) -> str:
    jobs = {}
    for record in records:
        entry: dict[str, object] = {}
        for key, value in record.items():
            if key == "Job_Id":
                continue
            if "." in key and key.split(".", 1)[0] in ("Resource_List", "resources_used"):
                head, tail = key.split(".", 1)
                entry.setdefault(head, {})[tail] = value  # type: ignore[union-attr]
            else:
                entry[key] = value
        jobs[record["Job_Id"]] = entry
    return json.dumps({"timestamp": 0, "pbs_version": "bench", "pbs_server": "bench", "Jobs": jobs})


def best_of(repeat: int, work: Callable[[], object]) -> float:
    """The least CPU time of `repeat` runs."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        work()
        times.append(time.process_time() - t0)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4_840)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    text, records = replicate(FIXTURE.read_text(), args.jobs)
    outputs = {"torque-text": text, "torque-xml": to_xml(records), "openpbs-json": to_json(records)}
    seconds: dict[str, float] = {}
    counts = {}
    for name in track(list(outputs), description="parsing"):
        jobs = parse_jobs(outputs[name], source=name)
        counts[name] = len(jobs)
        seconds[name] = best_of(args.repeat, lambda n=name: parse_jobs(outputs[n], source=n))
    assert len(set(counts.values())) == 1, counts  # the same queue in every format
    table = Table(title=f"Reading a queue of {args.jobs:,} jobs (best of {args.repeat})")
    for column in ("format", "output MiB", "CPU ms total", "CPU ms per 1,000 jobs"):
        table.add_column(column, justify="right")
    for name, secs in seconds.items():
        table.add_row(
            name, f"{len(outputs[name]) / 2**20:.1f}", f"{secs * 1000:.0f}", f"{secs * 1000 / args.jobs * 1000:.1f}"
        )
    Console().print(table)
    figures = {
        "bench": "pbs_parse",
        "jobs": args.jobs,
        "cpu_ms_per_1000_jobs": {k: round(v * 1e6 / args.jobs, 2) for k, v in seconds.items()},
        "text_over_xml": round(seconds["torque-text"] / seconds["torque-xml"], 2),
        "json_over_xml": round(seconds["openpbs-json"] / seconds["torque-xml"], 2),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
