"""Load-generating clients: one thread per app, each request recorded as a JSON line.

Requests go out at a fixed rate per app through the client SDK, which retries across
failovers, so a request is either answered (with the variant that answered) or, after its
deadline, recorded as failed. Records land in ``<out>/<app>.jsonl``. Apps of a family with an
evaluation set in the artifact store (``store``: the digits family) send its real inputs and
record whether each answer's top-1 matches the label (``deploy.samples``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from deploy.samples import LabelledSamples, check
from understudy.client import ClientError, UnderstudyClient

logger = logging.getLogger(__name__)


def _samples_of(controller_url: str, app_id: str, store: Path | None) -> LabelledSamples | None:
    """The labelled inputs of the app's family, when the store has them."""
    if store is None:
        return None
    import httpx

    try:
        response = httpx.get(f"{controller_url.rstrip('/')}/v1/apps/{app_id}", timeout=10.0)
        family = response.json()["spec"]["family"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        logger.warning("client %s: family unknown (%s); sending random images", app_id, exc)
        return None
    return LabelledSamples.from_store(store, family, seed=abs(hash(app_id)) % 2**32)


def run_app_client(controller_url: str, app_id: str, token: str | None, rate: float,
                   out_dir: Path, stop: threading.Event, image_side: int = 224,
                   store: Path | None = None) -> None:
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
    samples = _samples_of(controller_url, app_id, store)
    with (out_dir / f"{app_id}.jsonl").open("a", encoding="utf-8") as log:
        next_at = time.monotonic()
        while not stop.is_set():
            checked: dict[str, object] = {}
            label = None
            if samples is not None:
                image, label = samples.next()
            try:
                result = client.infer(image, timeout_s=60.0)
                record = result.record
                if label is not None:
                    checked = check(result.logits, label)
            except ClientError:
                record = client.records[-1]
            log.write(json.dumps({"app_id": app_id, **asdict(record), **checked}) + "\n")
            log.flush()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                next_at = time.monotonic()  # behind (a failover): don't burst to catch up
    client.close()


def run_clients(controller_url: str, app_ids: list[str], token: str | None, rate: float,
                out_dir: Path, stop: threading.Event, store: Path | None = None) -> None:
    """Run one client thread per app until ``stop`` is set."""
    threads = [threading.Thread(target=run_app_client, name=f"client-{app_id}", daemon=True,
                                args=(controller_url, app_id, token, rate, out_dir, stop),
                                kwargs={"store": store})
               for app_id in app_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
