"""Redis requires a password everywhere we start it, and no command line or log line shows it.

The embedded server (``controller/redis_server.py``), the controller's command line with an
external Redis and a password file, and the testbed's Redis: an unauthenticated client is
refused (``NOAUTH``), a wrong password too; ``/proc/<pid>/cmdline`` of redis-server and the
controller does not contain the password; nor do the logs.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from controller.credentials import CredentialStore
from controller.redis_server import RedisServer
from deploy import testbed as tb
from deploy.testbed import Testbed, wait_until
from understudy.wire.ports import free_port
from understudy.wire.secret_files import read_secret_file, write_secret_file

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def _raw(port: int, command: bytes) -> bytes:
    """One inline command on a fresh connection, and the first line of the answer."""
    with socket.create_connection(("127.0.0.1", port), 5) as conn:
        conn.sendall(command + b"\r\n")
        return conn.makefile("rb").readline()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _assert_locked(port: int, password: str) -> None:
    assert _raw(port, b"PING").startswith(b"-NOAUTH")
    assert _raw(port, b"SET k v").startswith(b"-NOAUTH")
    assert _raw(port, b"AUTH not-it").startswith(b"-WRONGPASS")
    assert _raw(port, b"AUTH default not-it").startswith(b"-WRONGPASS")
    client = redis.Redis(port=port, password=password, socket_timeout=5)
    try:
        assert client.ping()
    finally:
        client.close()


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis data")  # a space: the config quotes the path
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_embedded_server_refuses_unauthenticated_clients(embedded: RedisServer) -> None:
    password = read_secret_file(embedded.password_file)
    _assert_locked(embedded.port, password)
    assert embedded.process is not None
    assert password not in _cmdline(embedded.process.pid)
    for name in ("password", "redis.conf"):
        assert (embedded.data_dir / name).stat().st_mode & 0o777 == 0o600
    assert password not in (embedded.data_dir / "redis.log").read_text()


def test_the_embedded_password_is_kept_across_restarts(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="controller.redis_server")
    first = RedisServer(tmp_path / "redis")
    first.start()
    client = redis.Redis.from_url(first.url)
    client.set("kept", "yes")
    first.stop()
    second = RedisServer(first.data_dir, port=first.port)
    second.start()
    try:
        assert second.password == first.password
        assert client.get("kept") == b"yes"  # the client's password still opens it
    finally:
        client.close()
        second.stop()
    assert caplog.records and all(first.password not in r.getMessage() for r in caplog.records)


def test_a_password_with_quotes_and_spaces_survives_the_config_file(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    password = 'pa ss"wo\\rd \'x'
    write_secret_file(data / "password", password + "\n")
    server = RedisServer(data)
    server.start()
    try:
        _assert_locked(server.port, password)
    finally:
        server.stop()


def _controller(run_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    log = (run_dir / "controller.log").open("wb")
    try:
        return subprocess.Popen(  # noqa: S603 - our own CLI
            [sys.executable, "-m", "understudy.cli.main", "--log-level", "INFO", "controller",
             "--run-dir", str(run_dir / "ctl"), *args],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _wait_ready(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> bool:
        assert process.poll() is None, f"the controller exited: {log.read_text()[-3000:]}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until("the controller", ready, 60)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def test_the_controller_takes_the_password_from_a_file_and_never_shows_it(
        embedded: RedisServer, tmp_path: Path) -> None:
    password = embedded.password
    port = free_port()
    process = _controller(tmp_path, "--port", str(port), "--redis-url", embedded.redacted_url,
                          "--redis-password-file", str(embedded.password_file))
    try:
        _wait_ready(port, process, tmp_path / "controller.log")
        assert password not in _cmdline(process.pid)
    finally:
        _stop(process)
    log = (tmp_path / "controller.log").read_text()
    assert "controller ready (redis redis://***@127.0.0.1:" in log
    assert password not in log


def test_the_controller_embedded_redis_has_a_generated_password(tmp_path: Path) -> None:
    port = free_port()
    process = _controller(tmp_path, "--port", str(port))
    try:
        _wait_ready(port, process, tmp_path / "controller.log")
        password_file = tmp_path / "ctl" / "redis" / "password"
        password = read_secret_file(password_file)
        redis_port = int(next(line.split()[1] for line in
                              (password_file.parent / "redis.conf").read_text().splitlines()
                              if line.startswith("port ")))
        _assert_locked(redis_port, password)
    finally:
        _stop(process)
    assert password not in (tmp_path / "controller.log").read_text()


def test_a_password_on_the_command_line_or_in_a_public_file_is_refused(tmp_path: Path) -> None:
    secret = "on-the-command-line"
    refused = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "controller", "--redis-url",
         f"redis://:{secret}@127.0.0.1:1/0"], cwd=REPO, capture_output=True, text=True,
        timeout=60, check=False)
    assert refused.returncode == 2
    assert "--redis-password-file" in refused.stderr and secret not in refused.stderr
    public = write_secret_file(tmp_path / "password", "s")
    public.chmod(0o644)
    refused = subprocess.run(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "controller", "--redis-url",
         "redis://127.0.0.1:1/0", "--redis-password-file", str(public)], cwd=REPO,
        capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "chmod 600" in refused.stderr


def test_the_testbed_redis_requires_its_password(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    state = tb.TestbedState(run_dir=str(tmp_path),
                            controller_url=f"http://127.0.0.1:{free_port()}",
                            redis_port=free_port(), artifacts=str(artifacts))
    CredentialStore(state.credentials).init()  # what Testbed.up makes first
    testbed = Testbed(state)
    try:
        redis_info = testbed.start_redis()
        controller = testbed.start_controller()
        password = read_secret_file(Path(state.redis_password_file))
        assert Path(state.redis_password_file).stat().st_mode & 0o777 == 0o600
        _assert_locked(state.redis_port, password)
        client = redis.Redis.from_url(testbed.redis_url())
        assert client.ping()
        client.close()
        for info in (redis_info, controller):
            assert password not in _cmdline(info.pid), info.name
            assert password not in " ".join(info.args)
        assert password not in (tmp_path / "testbed.json").read_text()
    finally:
        testbed.down()
    for log in (tmp_path / "logs").iterdir():
        assert password not in log.read_text(errors="replace"), log
