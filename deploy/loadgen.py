"""Load-generating clients: one thread per app, each request recorded as a JSON line.

Requests go out at a fixed rate per app through the client SDK, which retries across
failovers, so a request is either answered (with the variant that answered) or, after its
deadline, recorded as failed. Records land in ``<out>/<app>.jsonl``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from understudy.client import ClientError, UnderstudyClient

logger = logging.getLogger(__name__)


def run_app_client(controller_url: str, app_id: str, token: str | None, rate: float,
                   out_dir: Path, stop: threading.Event, image_side: int = 224) -> None:
    """Send requests for one app until ``stop`` is set."""
    out_dir.mkdir(parents=True, exist_ok=True)
    image = np.random.default_rng(abs(hash(app_id)) % 2**32).random(
        (1, 3, image_side, image_side), dtype=np.float32)
    interval = 1.0 / rate
    client = None
    while client is None and not stop.is_set():
        try:
            client = UnderstudyClient(controller_url, app_id, token).start()
        except (ClientError, OSError) as exc:
            logger.warning("client %s cannot start yet: %s", app_id, exc)
            stop.wait(1.0)
    if client is None:
        return
    with (out_dir / f"{app_id}.jsonl").open("a", encoding="utf-8") as log:
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                result = client.infer(image, timeout_s=60.0)
                record = result.record
            except ClientError:
                record = client.records[-1]
            log.write(json.dumps({"app_id": app_id, **asdict(record)}) + "\n")
            log.flush()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                next_at = time.monotonic()  # behind (a failover): don't burst to catch up
    client.close()


def run_clients(controller_url: str, app_ids: list[str], token: str | None, rate: float,
                out_dir: Path, stop: threading.Event) -> None:
    """Run one client thread per app until ``stop`` is set."""
    threads = [threading.Thread(target=run_app_client, name=f"client-{app_id}", daemon=True,
                                args=(controller_url, app_id, token, rate, out_dir, stop))
               for app_id in app_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
