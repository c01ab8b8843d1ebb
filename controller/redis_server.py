"""A private ``redis-server`` child process: the controller's embedded default, and tests' Redis.

Data lives under the given directory with append-only persistence (``appendfsync everysec``),
so killing and restarting the server keeps everything written more than a second before.

The server requires a password (``requirepass``). It is kept in ``<data_dir>/password`` (mode
0600; generated on first start, reused by later ones, so ``redis-cli`` users and a restarted
server agree) and reaches ``redis-server`` in its config file (``<data_dir>/redis.conf``, 0600),
never on its command line. :attr:`RedisServer.url` carries it for our clients; log lines use
:attr:`RedisServer.redacted_url`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from understudy.wire.ports import free_port
from understudy.wire.secret_files import redact_url, secret_file_or_new, write_secret_file

logger = logging.getLogger(__name__)

PASSWORD_FILE = "password"
CONFIG_FILE = "redis.conf"


class RedisStartError(RuntimeError):
    """``redis-server`` is missing or did not start."""


def config_value(text: str) -> str:
    """``text`` as one quoted argument of a Redis config line (spaces and quotes survive)."""
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise ValueError("a Redis config value may not contain control characters")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def redis_config(*, bind: str, port: int, data_dir: Path, password: str,
                 appendfsync: str = "everysec") -> str:
    """A ``redis.conf`` for one of our servers: append-only, no snapshots, password required."""
    lines = [
        f"bind {bind}",
        f"port {port}",
        f"dir {config_value(str(data_dir))}",
        "appendonly yes",
        f"appendfsync {appendfsync}",
        'save ""',
        "daemonize no",
        f"requirepass {config_value(password)}",
    ]
    return "\n".join(lines) + "\n"


def with_password(url: str, password: str | None) -> str:
    """``url`` with ``password`` in it (``redis://:PASSWORD@host:port/db``), for redis-py.

    A URL that already names a password keeps its own.
    """
    parts = urlsplit(url)
    if not password or parts.password:
        return url
    user = quote(parts.username, safe="") if parts.username else ""
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}"))


class RedisServer:
    """Owns one ``redis-server`` bound to 127.0.0.1 on a free (or given) port."""

    def __init__(self, data_dir: Path, port: int = 0, appendfsync: str = "everysec") -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.process: subprocess.Popen[bytes] | None = None
        self._password: str | None = None

    @property
    def password_file(self) -> Path:
        """The file holding this server's password (0600)."""
        return self.data_dir / PASSWORD_FILE

    @property
    def password(self) -> str:
        """This server's password (read from, or generated into, :attr:`password_file`)."""
        if self._password is None:
            self._password = secret_file_or_new(self.password_file)
        return self._password

    @property
    def redacted_url(self) -> str:
        """``redis://`` URL of this server without the password (for logs)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        """``redis://`` URL of this server with its password (log :attr:`redacted_url`)."""
        return with_password(self.redacted_url, self.password)

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it and wait until it answers PING (authenticated)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisStartError("redis-server is not installed (apt-get install redis-server)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # 0600: the file holds the password.
        config = write_secret_file(self.data_dir / CONFIG_FILE, redis_config(
            bind="127.0.0.1", port=self.port, data_dir=self.data_dir, password=self.password,
            appendfsync=self.appendfsync))
        log = (self.data_dir / "redis.log").open("ab")
        try:
            self.process = subprocess.Popen(  # noqa: S603 - fixed binary, our config file
                [binary, str(config)], stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        import redis

        client = redis.Redis(port=self.port, password=self.password, socket_timeout=1.0)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RedisStartError(f"redis-server exited with {self.process.returncode}; "
                                      f"see {self.data_dir / 'redis.log'}")
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    break
            if time.monotonic() > deadline:
                self.kill()
                raise RedisStartError(f"redis-server not answering after {timeout_s} s")
            time.sleep(0.02)
        client.close()
        logger.info("redis-server pid %d on %s (data in %s, password in %s)", self.process.pid,
                    redact_url(self.url), self.data_dir, self.password_file)

    def stop(self) -> None:
        """SIGTERM (Redis flushes the append-only file), then SIGKILL after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
