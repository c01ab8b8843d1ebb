"""Load-generating clients that go through the inference gateway, each request stamped.

A client sends one app's image requests at a fixed rate to ``understudy gateway`` as any
KServe v2 client would (a keep-alive HTTP connection, the binary tensor extension as
``tritonclient`` sends it) and knows nothing of failovers: the gateway follows them. Each
request is one JSON line (:func:`stamp`): sent and answered at, its outcome (``ok``; ``error``,
an answer with the gateway's reason; ``lost``, no answer and no error: a timeout, a reset, a
refused connection), and the server and variant that answered (the gateway's
``Understudy-Server`` / ``Understudy-Variant`` headers). ``deploy.outage`` reads them. A client
told to stop cuts the request it is waiting for (:meth:`GatewayCaller.abort`), which is not
recorded: the client ended it, not the gateway, as the SDK's clients do (``deploy.loadgen``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from deploy.samples import LabelledSamples, check

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0
"""The deadline a client gives the gateway (``Understudy-Timeout-Ms``)."""
SOCKET_SLACK_S = 5.0
"""The client waits this much longer than its deadline before it counts the request lost."""


def stamp(app_id: str, via: str, rate: float, sent_at: float, done_at: float, outcome: str,
          *, attempts: int = 1, server_id: str | None = None, variant: str | None = None,
          accuracy: float | None = None, error: str = "") -> dict[str, Any]:
    """One request's record, the same for every client kind (``deploy.outage`` reads it)."""
    return {"app_id": app_id, "via": via, "rate": rate, "sent_at": sent_at,
            "done_at": done_at, "ok": outcome == "ok", "outcome": outcome,
            "attempts": attempts, "server_id": server_id, "variant": variant,
            "accuracy": accuracy, "error": error}


def records_path(out_dir: Path, app_id: str, via: str, rate: float) -> Path:
    """Where one client's records go: one file per app and client kind."""
    return out_dir / f"{app_id}.{via}-{rate:g}rps.jsonl"


def encode_infer(array: np.ndarray, input_name: str = "image",
                 output_name: str = "logits") -> tuple[bytes, dict[str, str]]:
    """A KServe v2 infer body with the binary tensor extension, and its headers."""
    data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": input_name, "shape": list(array.shape),
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": output_name,
                                      "parameters": {"binary_data": True}}]}).encode()
    return header + data, {"Content-Type": "application/octet-stream",
                           "Inference-Header-Content-Length": str(len(header))}


class GatewayCaller:
    """Sends one app's pre-encoded request to the gateway on a keep-alive connection."""

    def __init__(self, gateway_url: str, app_id: str, body: bytes, headers: dict[str, str],
                 timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        parts = urlsplit(gateway_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.app_id = app_id
        self.path = f"/v2/models/{app_id}/infer"
        self.body = body
        self.deadline = {"Understudy-Timeout-Ms": str(int(timeout_s * 1000))}
        self.headers = {**headers, **self.deadline}
        self.timeout_s = timeout_s
        self._connection: http.client.HTTPConnection | None = None
        self.aborted = False
        self.reply: tuple[bytes, int | None] = (b"", None)
        """The last answer's body and its JSON header's length (binary tensor extension)."""

    def call(self, via: str = "gateway", rate: float = 0.0, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> dict[str, Any] | None:
        """Send once (this request, or the one given); its record (None once aborted)."""
        if self.aborted:
            return None
        sent = time.time()
        try:
            connection = self._connection or http.client.HTTPConnection(
                self.host, self.port, timeout=self.timeout_s + SOCKET_SLACK_S)
            self._connection = connection
            connection.request("POST", self.path, self.body if body is None else body,
                               self.headers if headers is None else {**headers,
                                                                     **self.deadline})
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()  # a fresh connection next time
            if self.aborted:
                return None
            return stamp(self.app_id, via, rate, sent, time.time(), "lost",
                         error=f"{type(exc).__name__}: {exc}")
        done = time.time()
        attempts = int(response.getheader("Understudy-Attempts") or 1)
        server = response.getheader("Understudy-Server")
        variant = response.getheader("Understudy-Variant")
        if response.status == 200:
            length = response.getheader("Inference-Header-Content-Length")
            self.reply = (body, int(length) if length and length.isdigit() else None)
            return stamp(self.app_id, via, rate, sent, done, "ok", attempts=attempts,
                         server_id=server, variant=variant)
        return stamp(self.app_id, via, rate, sent, done, "error", attempts=attempts,
                     server_id=server, variant=variant,
                     error=f"HTTP {response.status}: {_reason(body)}")

    def abort(self) -> None:
        """Stop: the request waiting for its answer ends at once (from another thread)."""
        self.aborted = True
        connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _reason(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", ""))[:300]
    except (ValueError, AttributeError):
        return body[:300].decode("utf-8", "replace")


def decode_output(body: bytes, header_length: int | None, name: str) -> np.ndarray | None:
    """Output ``name`` of a KServe v2 infer reply (JSON, or the binary tensor extension)."""
    try:
        header = json.loads(body[:header_length] if header_length is not None else body)
        offset = header_length or 0
        for output in header.get("outputs", []):
            size = (output.get("parameters") or {}).get("binary_data_size")
            if output.get("name") == name:
                if size is None:
                    return np.asarray(output["data"], dtype=np.float32)
                return np.frombuffer(body[offset:offset + size], dtype=np.float32)
            offset += size or 0
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def paced(call: Callable[[], dict[str, Any] | None], rate: float, path: Path,
          stop: threading.Event) -> int:
    """Call ``call`` ``rate`` times a second until ``stop``, one JSON line per request.

    A request that is late (a failover) delays the next ones instead of a burst to catch up.
    Returns how many requests were recorded; a call that returns None (cut short by the
    stop) ends the loop unrecorded.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    interval = 1.0 / rate
    sent = 0
    with path.open("a", encoding="utf-8") as log:
        next_at = time.monotonic()
        while not stop.is_set():
            record = call()
            if record is None:
                break
            sent += 1
            log.write(json.dumps(record) + "\n")
            log.flush()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                next_at = time.monotonic()
    return sent


def run_gateway_client(gateway_url: str, app_id: str, rate: float, out_dir: Path,
                       stop: threading.Event, image_side: int = 224,
                       callers: list[GatewayCaller] | None = None,
                       samples: Callable[[], LabelledSamples | None] | None = None) -> None:
    """Send one app's requests through the gateway until ``stop`` is set.

    The caller is added to ``callers``, for the one who stops the clients to abort it. Apps
    whose family has labelled inputs (``samples``, looked up in this thread) send those and
    record whether each answer's top-1 matches (``deploy.samples``); others a random image.
    """
    labelled = samples() if samples is not None else None
    image = np.random.default_rng(abs(hash(app_id)) % 2**32).random(
        (1, 3, image_side, image_side), dtype=np.float32)
    body, headers = encode_infer(image)
    caller = GatewayCaller(gateway_url, app_id, body, headers)
    if callers is not None:
        callers.append(caller)

    def call() -> dict[str, Any] | None:
        if labelled is None:
            return caller.call("gateway", rate)
        sample, label = labelled.next()
        record = caller.call("gateway", rate, *encode_infer(sample))
        if record is not None and record["ok"]:
            logits = decode_output(*caller.reply, "logits")
            if logits is not None:
                record.update(check(logits, label))
        return record

    try:
        paced(call, rate, records_path(out_dir, app_id, "gateway", rate), stop)
    finally:
        caller.close()
