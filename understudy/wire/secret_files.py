"""Secrets kept in files of mode 0600, and URLs with their password hidden for logs.

A secret never goes on a command line (any local user reads ``/proc/<pid>/cmdline``): a process
takes it from a file or the environment, and a child that needs it gets a file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

SECRET_MODE = 0o600


class SecretFileError(ValueError):
    """A secret file is missing, empty, or readable by other users."""


def new_secret() -> str:
    """A random secret: 256 bits, URL- and config-file-safe characters (no spaces, no quotes)."""
    return secrets.token_urlsafe(32)


def write_secret_file(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600 from the start (never readable by others).

    The file is created under a temporary name with ``O_EXCL`` and renamed over ``path``, so a
    reader sees the old or the new contents, and a pre-existing file of another mode (or a link
    someone placed there) is replaced, not written through.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return path


def read_secret_file(path: Path) -> str:
    """The secret in ``path``, without surrounding whitespace (a trailing newline is usual).

    Refused (:class:`SecretFileError`) when the file is missing, empty, or readable or writable
    by group or others: a secret other users can read is no longer one.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SecretFileError(f"cannot read secret file {path}: {exc.strerror}") from exc
    if stat.S_IMODE(mode) & 0o077:
        raise SecretFileError(f"secret file {path} has mode {stat.S_IMODE(mode):o}: other users "
                              f"may read it (chmod 600 {path})")
    if not text:
        raise SecretFileError(f"secret file {path} is empty")
    return text


def secret_file_or_new(path: Path) -> str:
    """The secret in ``path``, or a new one written there (0600) when there is none yet."""
    if path.exists():
        return read_secret_file(path)
    secret = new_secret()
    write_secret_file(path, secret + "\n")
    return secret


def redact_url(url: str) -> str:
    """``url`` with its password (and user) replaced by ``***``, for log lines and errors."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


def url_has_password(url: str) -> bool:
    """Whether ``url`` carries a password (``redis://:PASSWORD@host``)."""
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return False
