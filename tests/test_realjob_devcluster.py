"""The dev cluster is ready for real jobs (issue 15): debian12 in the image list once the
catalogue has it, and a pilot directory every user's pilot can create its directory in."""

from __future__ import annotations

import stat
from pathlib import Path

from devkit.devcluster import DevCluster, Settings
from plugins.slurm.images import read_image_list, write_image_list
from provisioning.images import Catalogue
from vjob.config import parse
from vjob.store.db import Store


def test_the_catalogues_images_join_the_list_and_none_is_removed(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "dc")
    cluster.etc.mkdir(parents=True)
    assert cluster.sync_image_list() == ["debian-tiny"]  # no store yet: the shipped image
    write_image_list(cluster.image_list, ["debian-tiny", "added-by-a-test"])
    data = cluster.root / "vjob"
    store = Store(f"sqlite:///{data / 'vjob.sqlite'}")
    data.mkdir(exist_ok=True)
    store.upgrade()
    disk = tmp_path / "d.raw"
    disk.write_bytes(b"\0" * 65536)
    cfg = parse({"data_dir": str(data)})
    Catalogue(store, cfg.provisioning, data_dir=cfg.data_path).add("debian12", disk)
    store.close()
    assert cluster.sync_image_list() == ["added-by-a-test", "debian-tiny", "debian12"]
    assert read_image_list(cluster.image_list) == ["added-by-a-test", "debian-tiny", "debian12"]


def test_the_pilot_directory_is_world_writable_and_sticky(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "dc")
    cluster._make_dirs(Settings(run_dir=cluster.root, nodes=2))
    mode = cluster.pilot_dir.stat().st_mode
    assert stat.S_IMODE(mode) == 0o1777
    assert cluster.pilot_dir == parse({"data_dir": str(cluster.root / "vjob")}).data_path / "pilots"
