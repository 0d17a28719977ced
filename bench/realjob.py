"""Real jobs: image build time and size, and `vjob run` → the script's first line in the guest.

    .venv/bin/python bench/realjob.py [--rebuild]

Prints one JSON line. `--rebuild` builds the image without the cache (about a minute); by
default the cached build is reused and the build time reported is the cache's recorded one
(the catalogue copy is timed). The first-line figure is from starting `vjob run` (root's
libvirt, the domain type as `auto` decides: TCG here) to the first byte of the script's stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioning import image_build, kvm_probe
from provisioning.images import Catalogue
from vjob.config import ProvisioningConfig
from vjob.store.db import Store


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rebuild", action="store_true", help="build without the cache")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="vjob-bench-realjob-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        if args.rebuild:
            shutil.rmtree(image_build.image_cache() / image_build._cache_key([]), ignore_errors=True)
        store = Store(f"sqlite:///{base / 'vjob.sqlite'}")
        store.upgrade()
        result = image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=base / "data"), "debian12")
        store.close()
        (base / "vjob.toml").write_text(f'data_dir = "{base / "data"}"\n')
        work = base / "work"
        work.mkdir()
        (work / "job.sh").write_text("#!/bin/sh\necho first line\nexit 0\n")
        out = base / "out"
        t0 = time.monotonic()
        pilot = subprocess.Popen(
            [sys.executable, "-m", "vjob.cli", "--config", str(base / "vjob.toml"), "run", "--job-id", "bench",
             "--node", "n1", "--os", "debian12", "--script", "job.sh"],
            cwd=work, stdout=out.open("wb"), stderr=subprocess.DEVNULL,
        )  # fmt: skip
        first = None
        while pilot.poll() is None or first is None:
            if first is None and out.stat().st_size > 0:
                first = time.monotonic() - t0
            if pilot.poll() is not None and first is None:
                break
            time.sleep(0.05)
        total = time.monotonic() - t0
        line = {
            "bench": "realjob",
            "image": "debian12",
            "image_mb": round(result.size_bytes / 2**20, 1),
            "build_s": round(result.build_s, 1),
            "build_cached": result.cached,
            "domain_type": kvm_probe.cached("qemu64") or "qemu",
            "first_line_s": round(first, 2) if first is not None else None,
            "run_total_s": round(total, 2),
            "exit": pilot.returncode,
        }
        print(json.dumps(line))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
