"""Secret files (0600, refused when others may read them), redacted URLs, Redis config lines."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from controller.redis_server import config_value, redis_config, with_password
from understudy.wire.secret_files import (
    SecretFileError,
    read_secret_file,
    redact_url,
    secret_file_or_new,
    url_has_password,
    write_secret_file,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_secret_file_is_private_from_the_start_and_replaces_a_public_one(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "secret"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)
    write_secret_file(path, "new\n")
    assert _mode(path) == 0o600
    assert read_secret_file(path) == "new"
    assert [p.name for p in path.parent.iterdir()] == ["secret"], "no temporary file left"


def test_a_link_in_the_way_is_replaced_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / "secret"
    link.symlink_to(target)
    write_secret_file(link, "s")
    assert target.read_text() == "keep"
    assert not link.is_symlink() and read_secret_file(link) == "s"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o606])
def test_a_secret_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_secret_file(tmp_path / "secret", "s")
    path.chmod(mode)
    with pytest.raises(SecretFileError, match="chmod 600"):
        read_secret_file(path)


def test_missing_and_empty_secrets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretFileError, match="cannot read"):
        read_secret_file(tmp_path / "none")
    with pytest.raises(SecretFileError, match="empty"):
        read_secret_file(write_secret_file(tmp_path / "empty", " \n"))


def test_a_generated_secret_is_kept_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "password"
    first = secret_file_or_new(path)
    assert len(first) >= 40 and first.isascii() and " " not in first
    assert _mode(path) == 0o600
    assert secret_file_or_new(path) == first
    assert secret_file_or_new(tmp_path / "other") != first


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:pw@127.0.0.1:6379/0", "redis://***@127.0.0.1:6379/0"),
    ("redis://user:p%40ss@redis:6379/1", "redis://***@redis:6379/1"),
    ("rediss://:pw@[::1]:6380/0", "rediss://***@[::1]:6380/0"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_urls_are_logged_without_their_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert url_has_password(url) == ("pw" in url or "p%40ss" in url)


def test_the_password_goes_into_the_url_encoded() -> None:
    url = with_password("redis://10.0.0.5:6379/0", "a/b@c:d")
    assert url == "redis://:a%2Fb%40c%3Ad@10.0.0.5:6379/0"
    assert with_password("redis://:own@h:1/0", "other") == "redis://:own@h:1/0"
    assert with_password("redis://h:1/0", None) == "redis://h:1/0"

    from redis.connection import parse_url

    assert parse_url(url)["password"] == "a/b@c:d"


def test_redis_config_quotes_values_and_requires_the_password(tmp_path: Path) -> None:
    text = redis_config(bind="127.0.0.1", port=7000, data_dir=tmp_path / "a dir",
                        password='p"w\\x')
    lines = text.splitlines()
    assert "bind 127.0.0.1" in lines and "port 7000" in lines and "appendonly yes" in lines
    assert f'dir "{tmp_path / "a dir"}"' in lines
    assert 'requirepass "p\\"w\\\\x"' in lines
    with pytest.raises(ValueError, match="control characters"):
        config_value("a\nrequirepass x")


def test_the_controller_takes_the_redis_password_from_a_file_before_the_environment(
        tmp_path: Path) -> None:
    from controller.service import Controller, ControllerSettings
    from understudy.cli.controller import ENV_PREFIX, REDIS_PASSWORD_ENV
    from understudy.wire.settings import resolve

    environ = {REDIS_PASSWORD_ENV: "from-env"}
    flags = {"redis_url": "redis://10.0.0.5:6379/0", "run_dir": tmp_path}
    settings = resolve(ControllerSettings, flags, ENV_PREFIX,
                       env_names={"redis_password": REDIS_PASSWORD_ENV}, environ=environ)
    assert "from-env" not in repr(settings)  # a SecretStr: not in a logged settings object
    assert Controller(settings).redis_password() == "from-env"
    file = write_secret_file(tmp_path / "password", "from-file\n")
    settings = resolve(ControllerSettings, {**flags, "redis_password_file": file}, ENV_PREFIX,
                       env_names={"redis_password": REDIS_PASSWORD_ENV}, environ=environ)
    assert Controller(settings).redis_password() == "from-file"
    settings = resolve(ControllerSettings, flags, ENV_PREFIX, environ={})
    assert Controller(settings).redis_password() is None
