"""The image list job_submit.lua reads follows the provisioning catalogue."""

from __future__ import annotations

from pathlib import Path

from plugins.slurm.images import SHIPPED_IMAGES, read_image_list, sync_image_list
from provisioning.images import Catalogue
from vjob.config import parse
from vjob.store.db import Store


def test_sync_writes_the_catalogue_names_only_when_they_change(store: Store, tmp_path: Path) -> None:
    listing = tmp_path / "vjob-images.list"
    cfg = parse({"data_dir": str(tmp_path / "data"), "slurm": {"image_list": str(listing)}})
    assert sync_image_list(cfg, store) == list(SHIPPED_IMAGES)
    first = listing.stat().st_mtime_ns
    assert sync_image_list(cfg, store) == list(SHIPPED_IMAGES) and listing.stat().st_mtime_ns == first
    disk = tmp_path / "alpine.raw"
    disk.write_bytes(b"\0" * 65536)
    Catalogue(store, cfg.provisioning, data_dir=cfg.data_path).add("alpine-3", disk)
    assert sync_image_list(cfg, store) == sorted(["alpine-3", *SHIPPED_IMAGES])
    assert read_image_list(listing) == sorted(["alpine-3", *SHIPPED_IMAGES])
    listing.write_text("not/a valid name\n")
    assert sync_image_list(cfg, store) and read_image_list(listing) == sorted(["alpine-3", *SHIPPED_IMAGES])


def test_sync_does_nothing_without_a_configured_list(store: Store, tmp_path: Path) -> None:
    assert sync_image_list(parse({"data_dir": str(tmp_path)}), store) is None
