"""A private ``redis-server`` child process: the controller's embedded default, and tests' Redis.

Data lives under the given directory with append-only persistence (``appendfsync everysec``),
so killing and restarting the server keeps everything written more than a second before.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import subprocess
import time
from pathlib import Path

from understudy.wire.ports import free_port

logger = logging.getLogger(__name__)


class RedisStartError(RuntimeError):
    """``redis-server`` is missing or did not start."""


class RedisServer:
    """Owns one ``redis-server`` bound to 127.0.0.1 on a free (or given) port."""

    def __init__(self, data_dir: Path, port: int = 0, appendfsync: str = "everysec") -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it and wait until it answers PING."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisStartError("redis-server is not installed (apt-get install redis-server)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir / "redis.log").open("ab")
        try:
            self.process = subprocess.Popen(  # noqa: S603 - fixed binary and arguments
                [binary, "--bind", "127.0.0.1", "--port", str(self.port),
                 "--dir", str(self.data_dir), "--appendonly", "yes",
                 "--appendfsync", self.appendfsync, "--save", "", "--protected-mode", "no",
                 "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()
        import redis

        client = redis.Redis(port=self.port, socket_timeout=1.0)
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
        logger.info("redis-server pid %d on %s (data in %s)", self.process.pid, self.url,
                    self.data_dir)

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
