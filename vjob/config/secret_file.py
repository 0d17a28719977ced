"""The database password kept in a file of its own (`[database] password_file`), or in a
systemd credential, instead of in vjob.toml.

Why a separate file: vjob.toml is read by every vjob command, including the pilots that run as
job users, and `vjob config show` prints it; the password belongs in a file only the agent's
user can read, or in systemd's `LoadCredential=` (the unit gets a private copy under
$CREDENTIALS_DIRECTORY). Why the checks: a password file anyone can read, or one another user
could have written (and so choose the password the agent sends, or swap for a link to a file
the agent can read), is worse than none, so such a file is refused with its path and mode.

The file is read when the database URL is needed (opening the store), not when the
configuration is parsed: a pilot running as a job user reads the same vjob.toml and has no
business with, nor access to, the password.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from vjob.errors import ConfigError

MAX_SECRET_BYTES = 4096
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


def secret_path(name: str) -> Path:
    """The file `password_file` names: an absolute path as it is, a bare name in systemd's
    $CREDENTIALS_DIRECTORY (the unit's `LoadCredential=NAME:/etc/vjob/db-password`)."""
    if name.startswith("/"):
        return Path(name)
    directory = os.environ.get(CREDENTIALS_ENV)
    if not directory:
        raise ConfigError(
            f"database.password_file = {name!r}: a credential name is read in ${CREDENTIALS_ENV}, which is "
            f"not set (run under systemd with LoadCredential={name}:/etc/vjob/db-password, or give an "
            "absolute path)"
        )
    return Path(directory) / name


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def read_secret(name: str) -> str:
    """The password in the file `name` names (its first line, without the line end), after
    checking it is a regular file owned by root or this process's user and that others have no
    access; a ConfigError naming the path (and the mode or owner) otherwise."""
    path = secret_path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        reason = "is a symbolic link" if exc.errno == 40 else f"cannot be read: {exc.strerror}"
        raise ConfigError(f"database.password_file: {path} {reason}") from None
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"database.password_file: {path} is not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise ConfigError(
                f"database.password_file: {path} is owned by {_owner(st.st_uid)}, neither root nor the user vjob "
                f"runs as ({_owner(os.geteuid())}): chown root {path}"
            )
        if mode & 0o007:
            raise ConfigError(
                f"database.password_file: {path} has mode {mode:04o}, which lets other users "
                f"{'read' if mode & 0o004 else 'use'} it: chmod 600 {path} (or 640 with the agent's group)"
            )
        raw = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_SECRET_BYTES:
        raise ConfigError(f"database.password_file: {path} is larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"database.password_file: {path} is not UTF-8 text") from None
    password = text.split("\n", 1)[0].removesuffix("\r")
    if not password:
        raise ConfigError(f"database.password_file: {path}: its first line is empty")
    return password


def with_password(url: str, password: str) -> str:
    """`url` with `password` in its password slot (percent-encoded by SQLAlchemy's URL)."""
    from sqlalchemy.engine import make_url  # only when a store is opened: config loads stay light

    return make_url(url).set(password=password).render_as_string(hide_password=False)
