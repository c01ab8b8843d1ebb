"""Where a process finds the credential it presents to the controller, and the CA it trusts.

Credentials never come from the command line (another user sees it in ``ps``). Precedence,
highest first:

1. ``--token-file PATH`` (the processes' flag; the SDK's ``token_file=``);
2. ``$UNDERSTUDY_TOKEN_FILE``: names a file holding the token;
3. ``$UNDERSTUDY_TOKEN``: holds the token itself.

A token file holds one line, readable by its owner only (mode 0600; one that others may read is
refused, as every secret file is: ``understudy.wire.secret_files``).
The CA that verifies the controller's TLS certificate comes from ``--ca-file`` or
``$UNDERSTUDY_CA_FILE``; without one, ``https://`` and ``wss://`` use the system's CAs.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Mapping
from pathlib import Path

from understudy.wire.secret_files import SecretFileError, read_secret_file

logger = logging.getLogger(__name__)

TOKEN_ENV = "UNDERSTUDY_TOKEN"
TOKEN_FILE_ENV = "UNDERSTUDY_TOKEN_FILE"
CA_FILE_ENV = "UNDERSTUDY_CA_FILE"
MAX_TOKEN_FILE_BYTES = 4096


class CredentialFileError(ValueError):
    """A token or CA file that cannot be used (missing, empty, too large, readable by others)."""


def read_token_file(path: Path) -> str:
    """The token in ``path`` (its first line, stripped)."""
    try:
        if path.stat().st_size > MAX_TOKEN_FILE_BYTES:
            raise CredentialFileError(f"token file {path} is larger than "
                                      f"{MAX_TOKEN_FILE_BYTES} bytes")
        text = read_secret_file(path)
    except OSError as exc:
        raise CredentialFileError(f"cannot read the token file {path}: {exc.strerror}") from exc
    except SecretFileError as exc:
        raise CredentialFileError(str(exc)) from exc
    return text.splitlines()[0].strip()


def load_token(token_file: Path | None = None,
               environ: Mapping[str, str] | None = None) -> str | None:
    """The credential to present: ``token_file``, else the environment, else None."""
    environ = os.environ if environ is None else environ
    if token_file is not None:
        return read_token_file(token_file)
    named = environ.get(TOKEN_FILE_ENV)
    if named:
        return read_token_file(Path(named))
    return environ.get(TOKEN_ENV) or None


def ca_file_of(ca_file: Path | None = None,
               environ: Mapping[str, str] | None = None) -> Path | None:
    """The CA file to verify the controller with: ``ca_file``, else ``$UNDERSTUDY_CA_FILE``."""
    environ = os.environ if environ is None else environ
    if ca_file is not None:
        return ca_file
    named = environ.get(CA_FILE_ENV)
    return Path(named) if named else None


def client_ssl_context(ca_file: Path | None) -> ssl.SSLContext:
    """A context that verifies servers against ``ca_file`` (the system's CAs when None)."""
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise CredentialFileError(f"cannot use the CA file {ca_file}: {exc}") from exc


def bearer(token: str | None) -> dict[str, str]:
    """The ``Authorization`` header presenting ``token`` ({} without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}
