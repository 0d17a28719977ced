"""The OS image request convention for Slurm jobs, and the image list job_submit.lua reads.

Why a plain list file: job_submit.lua runs inside slurmctld under its job lock, so it must not
call a program or a database. The catalogue of OS images is owned by provisioning; whoever
changes it (the agent, `deploy/devcluster up`, an operator) writes the names, one per line,
into `vjob-images.list` next to slurm.conf with `write_image_list`, atomically.

A job asks for an image with `--comment=vjob:os=NAME` or a `#VJOB os=NAME` line among the
script's leading comment lines (like #SBATCH). job_submit.lua validates the name and records
the result in the job's admin comment as `vjob:class=CLASS,os=NAME`, which users cannot set.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from provisioning.images import Catalogue
from vjob.errors import InputError

if TYPE_CHECKING:  # the submit-time helpers stay light to import (the pilot uses them)
    from vjob.config import Config
    from vjob.store.db import Store

SHIPPED_IMAGES = ("debian-tiny",)
"""Images every vjob installation can run without the catalogue (provisioning.guest's tiny guest)."""
IMAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_COMMENT_OS = re.compile(r"(?:^|[\s,;])vjob:os=([^\s,;]*)")
_SCRIPT_OS = re.compile(r"#VJOB\s+os=(\S*)\s*")
_TAG = re.compile(r"vjob:class=([a-z]+),os=([A-Za-z0-9._-]*)")


def check_image_name(name: str, where: str = "os image") -> str:
    if not isinstance(name, str) or not IMAGE_NAME.fullmatch(name):
        raise InputError(
            f"{where} {str(name)[:80]!r}: must be 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def requested_image(comment: str = "", script: str = "") -> str:
    """The image a job asks for ('' when none), from its comment or its script's #VJOB line.

    Both given and different is an InputError: the user meant one of them, vjob cannot guess.
    """
    from_comment = ""
    match = _COMMENT_OS.search(comment or "")
    if match:
        from_comment = check_image_name(match.group(1), "comment vjob:os=")
    from_script = ""
    for line in (script or "").splitlines()[1:200]:
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        found = _SCRIPT_OS.fullmatch(stripped)
        if found:
            from_script = check_image_name(found.group(1), "script #VJOB os=")
    if from_comment and from_script and from_comment != from_script:
        raise InputError(f"os image: comment says {from_comment!r}, script says {from_script!r}: give one")
    return from_comment or from_script


def parse_tag(admin_comment: str) -> tuple[str, str] | None:
    """(class, os) from the admin-comment tag job_submit.lua writes, or None when untagged."""
    match = _TAG.search(admin_comment or "")
    return (match.group(1), match.group(2)) if match else None


_TAG_DEADLINE = re.compile(r"vjob:class=[a-z]+,os=[A-Za-z0-9._-]*,deadline=(\d{1,12})(?![\d])")


def parse_deadline_tag(admin_comment: str) -> float | None:
    """The deadline (POSIX seconds) job_submit.lua recorded from `#VJOB deadline=` or
    `--comment=vjob:deadline=`, or None."""
    match = _TAG_DEADLINE.search(admin_comment or "")
    return float(match.group(1)) if match else None


def write_image_list(path: Path, names: Iterable[str]) -> None:
    """Write the names, validated and sorted, atomically; readable by slurmctld's user."""
    clean = sorted({check_image_name(str(n)) for n in names})
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(
        "# OS images vjob jobs may ask for (written by vjob; one name per line)\n" + "".join(f"{n}\n" for n in clean)
    )
    os.chmod(tmp, 0o644)
    tmp.replace(path)


def read_image_list(path: Path) -> list[str]:
    """The names in an image list file, ignoring comments and blank lines."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read the image list: {exc.strerror}") from None
    names = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            names.append(check_image_name(line, f"{path}:{number}:"))
    return names


def sync_image_list(config: Config, store: Store) -> list[str] | None:
    """Rewrite `[slurm] image_list` from the image catalogue when it differs; None if not configured.

    Called by whoever changes the catalogue or watches it (the agent, once per tick): reading
    the catalogue is one query, and the file is only rewritten when the names changed.
    """
    if not config.slurm.image_list:
        return None
    catalogue = Catalogue(store, config.provisioning, data_dir=config.data_path)
    names = sorted({info.name for info in catalogue.list()} | set(SHIPPED_IMAGES))
    path = Path(config.slurm.image_list)
    try:
        current = read_image_list(path) if path.exists() else None
    except InputError:
        current = None  # a damaged list is replaced
    if current != names:
        write_image_list(path, names)
    return names
