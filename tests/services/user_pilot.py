"""What an ordinary user's pilot needs on the dev cluster's host, made once for every real-guest
test that submits as that user (tests/test_realjob_slurm.py, the guests' network, bridge and
filesystem tests): a `vjob` command the user can run, the debian12 image in a store of the
test's own, a pilot directory every user may write into, and the site's vjob.toml naming them.

Why a shim rather than the venv's `vjob`: the venv's interpreter may live where users cannot
reach (e.g. under /root); the system python3 with this checkout and the venv's packages on its
path runs the same code as the user.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from provisioning import image_build
from provisioning.images import Catalogue
from vjob.config import ProvisioningConfig
from vjob.store.db import Store

REPO = Path(__file__).resolve().parents[2]


def shim(top: Path) -> Path:
    """`<top>/bin/vjob` for the user; the directory to put first on its PATH."""
    bindir = top / "bin"
    bindir.mkdir(mode=0o755)
    path = f"{REPO}:{sysconfig.get_paths()['purelib']}"
    (bindir / "vjob").write_text(f'#!/bin/sh\nPYTHONPATH={path} exec /usr/bin/python3 -m vjob.cli "$@"\n')
    (bindir / "vjob").chmod(0o755)
    return bindir


def prepare(top: Path) -> Path:
    """Under `top` (0755, the test's): the debian12 image (from the cache after the first
    build), `pilots/` (1777, sticky) and the shim; returns the shim's directory."""
    store = Store(f"sqlite:///{top / 'vjob.sqlite'}")
    store.upgrade()
    try:
        image_build.build(Catalogue(store, ProvisioningConfig(), data_dir=top / "data"), "debian12")
    finally:
        store.close()
    (top / "pilots").mkdir(mode=0o1777)
    (top / "pilots").chmod(0o1777)  # the umask took the sticky and world bits
    return shim(top)


def write_config(top: Path, extra: str = "") -> Path:
    """`<top>/vjob.toml` (0644: every user's pilot reads it) naming the data and pilot
    directories, then `extra` TOML lines (a [node] socket, a [guest] section)."""
    conf = top / "vjob.toml"
    conf.write_text(f'data_dir = "{top / "data"}"\n[agent]\npilot_dir = "{top / "pilots"}"\n{extra}')
    conf.chmod(0o644)
    return conf
