"""Load-generating clients: one thread per app, each request recorded as a JSON line.

Requests go out at a fixed rate per app through one SDK client (``understudy.sdk.Client``),
which resends them across failovers, so a request is either answered (with the server and
variant that answered) or, after its deadline, recorded as failed with the reason; or
(``via="gateway"``) through the inference gateway (``deploy.gateway_load``). Records
(``deploy.gateway_load.stamp``'s fields, the SDK's besides) land in
``<out>/<app>.<via>-<rate>rps.jsonl``. When ``stop`` is set the clients are closed: requests
still waiting end at once and are not recorded (they were cut short, not failed), so the
process stops within two seconds even while the controller is unreachable. Apps of a family
with an evaluation set in the artifact store (``store``: the digits family) send its real
inputs and record whether each answer's top-1 matches the label (``deploy.samples``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np

from deploy.gateway_load import GatewayCaller, records_path, run_gateway_client
from deploy.samples import LabelledSamples, check
from understudy.sdk import Client, ClosedError, RequestRecord, SdkError

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 60.0
JOIN_S = 0.5
"""How long the app threads get to return once the client is closed."""


def _samples_of(controller_url: str, app_id: str, token: str | None,
                store: Path | None, ca_file: str | None = None) -> LabelledSamples | None:
    """The labelled inputs of the app's family, when the store has them."""
    if store is None:
        return None
    import httpx

    from understudy.wire.credentials import bearer, client_ssl_context

    try:
        response = httpx.get(f"{controller_url.rstrip('/')}/v1/apps/{app_id}",
                             headers=bearer(token), timeout=10.0,
                             verify=client_ssl_context(Path(ca_file) if ca_file else None))
        family = response.json()["spec"]["family"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        logger.warning("client %s: family unknown (%s); sending random images", app_id, exc)
        return None
    return LabelledSamples.from_store(store, family, seed=abs(hash(app_id)) % 2**32)


def run_app_client(client: Client, app_id: str, rate: float, out_dir: Path,
                   stop: threading.Event, image_side: int = 224,
                   samples: Callable[[], LabelledSamples | None] | None = None) -> None:
    """Send requests for one app until ``stop`` is set (or the client is closed).

    ``samples`` looks up the app's labelled inputs; it runs in this thread, so that a slow
    controller delays only this app's first request, never the stop.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    labelled = samples() if samples is not None else None
    image = np.random.default_rng(abs(hash(app_id)) % 2**32).random(
        (1, 3, image_side, image_side), dtype=np.float32)
    interval = 1.0 / rate
    stamped = {"via": "sdk", "rate": rate}
    with records_path(out_dir, app_id, "sdk", rate).open("a", encoding="utf-8") as log:
        next_at = time.monotonic()
        while not stop.is_set():
            checked: dict[str, object] = {}
            label = None
            if labelled is not None:
                image, label = labelled.next()
            try:
                result = client.infer(app_id, {"image": image}, ["logits"],
                                      timeout_s=REQUEST_TIMEOUT_S)
                record = result.record
                if label is not None:
                    checked = check(result.outputs["logits"], label)
            except ClosedError:
                return
            except SdkError as exc:
                record = exc.record or RequestRecord(time.time(), time.time(), False, 0,
                                                     error=str(exc), app_id=app_id,
                                                     reason=exc.reason)
            log.write(json.dumps({**asdict(record), "app_id": app_id, **checked, **stamped,
                                  "outcome": "ok" if record.ok else "error"}) + "\n")
            log.flush()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                next_at = time.monotonic()  # behind (a failover): don't burst to catch up


def run_clients(controller_url: str, app_ids: list[str], token: str | None, rate: float,
                out_dir: Path, stop: threading.Event, protocol: str = "http",
                ca_file: str | None = None, store: Path | None = None, via: str = "sdk",
                gateway_url: str | None = None) -> None:
    """Run one client thread per app until ``stop`` is set, then close the client.

    ``via="gateway"``: through the gateway at ``gateway_url`` instead of the SDK.
    """
    if via == "gateway":
        if not gateway_url:
            raise ValueError("gateway clients need the gateway's URL")
        run_gateway_clients(gateway_url, app_ids, rate, out_dir, stop,
                            samples={a: partial(_samples_of, controller_url, a, token, store)
                                     for a in app_ids} if controller_url else {})
        return
    client = Client(controller_url, token=token, ca_file=ca_file, protocol=protocol,
                    timeout_s=REQUEST_TIMEOUT_S)
    threads = [threading.Thread(target=run_app_client, name=f"client-{app_id}", daemon=True,
                                args=(client, app_id, rate, out_dir, stop),
                                kwargs={"samples": partial(_samples_of, controller_url, app_id,
                                                           token, store, ca_file)})
               for app_id in app_ids]
    try:
        for thread in threads:
            thread.start()
        stop.wait()
    finally:
        client.close()
        deadline = time.monotonic() + JOIN_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def run_gateway_clients(gateway_url: str, app_ids: list[str], rate: float, out_dir: Path,
                        stop: threading.Event,
                        samples: dict[str, Callable[[], LabelledSamples | None]] | None = None
                        ) -> None:
    """One gateway client thread per app until ``stop``; then requests in flight are cut.

    ``samples``: per app, the look-up of its labelled inputs (``_samples_of``).
    """
    callers: list[GatewayCaller] = []
    threads = [threading.Thread(target=run_gateway_client, name=f"client-{app_id}", daemon=True,
                                args=(gateway_url, app_id, rate, out_dir, stop),
                                kwargs={"callers": callers,
                                        "samples": (samples or {}).get(app_id)})
               for app_id in app_ids]
    try:
        for thread in threads:
            thread.start()
        stop.wait()
    finally:
        for caller in list(callers):
            caller.abort()
        deadline = time.monotonic() + JOIN_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
