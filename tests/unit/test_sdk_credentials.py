"""The SDK's clients find their credential as the CLI does: the argument, a token file, then
``$UNDERSTUDY_TOKEN_FILE`` or ``$UNDERSTUDY_TOKEN``; the CA file from ``$UNDERSTUDY_CA_FILE``."""

from __future__ import annotations

from pathlib import Path

import pytest

from understudy.sdk.aio import AsyncClient
from understudy.sdk.follower import ControllerRoutes
from understudy.wire.credentials import CredentialFileError

URL = "http://127.0.0.1:9"


def _secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def _routes(client: AsyncClient) -> ControllerRoutes:
    assert isinstance(client.routes, ControllerRoutes)
    return client.routes


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("UNDERSTUDY_TOKEN", "UNDERSTUDY_TOKEN_FILE", "UNDERSTUDY_CA_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_the_token_argument_wins_over_file_and_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNDERSTUDY_TOKEN", "from-env")
    client = AsyncClient(URL, token="given", token_file=_secret(tmp_path / "t", "from-file"))
    assert _routes(client).headers == {"Authorization": "Bearer given"}


def test_a_token_file_is_read(tmp_path: Path) -> None:
    client = AsyncClient(URL, token_file=str(_secret(tmp_path / "t", "from-file")))
    assert _routes(client).headers == {"Authorization": "Bearer from-file"}


def test_the_environment_names_the_file_or_holds_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNDERSTUDY_TOKEN", "from-env")
    assert _routes(AsyncClient(URL)).headers == {"Authorization": "Bearer from-env"}
    monkeypatch.setenv("UNDERSTUDY_TOKEN_FILE", str(_secret(tmp_path / "t", "named")))
    assert _routes(AsyncClient(URL)).headers == {"Authorization": "Bearer named"}


def test_no_credential_sends_no_header() -> None:
    assert _routes(AsyncClient(URL)).headers == {}


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    public = tmp_path / "t"
    public.write_text("secret\n")
    public.chmod(0o644)
    with pytest.raises(CredentialFileError):
        AsyncClient(URL, token_file=public)


def test_the_ca_file_comes_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNDERSTUDY_CA_FILE", str(tmp_path / "missing-ca.pem"))
    with pytest.raises(OSError):  # the named bundle is used (and here does not exist)
        AsyncClient(URL)
