"""The shipped digits family on real processes: its profile, then a live failover of one app.

Usage: ``python bench/real_models.py [--repeats 5] [--requests 50] [--device auto]``.

1. The digits family is trained (``model_repo.digits``; cached in ``--digits-dir``) and imported
   into a fresh store with ``understudy models import``'s code: every variant is loaded
   ``--repeats`` times on a real Triton (median load time), its resident memory read from the
   per-server runtime, its batch-1 latency measured over ``--requests`` requests, and its top-1
   measured by sending the held-out split through that Triton (``accuracy_source`` "measured").
2. A testbed (Redis, controller, two agents with their own Triton, two sites) serves two
   critical apps of the family, one per server, each with a warm backup on the other server
   (sized with 40 % headroom, so the backup is a smaller variant than the one serving). The
   whole held-out split is sent to the first app through the SDK and checked against the
   labels; a client thread keeps sending digits at ``--rate`` requests/s while the app's server
   is SIGKILLed; once the app serves from the other server the whole split is sent again.
   ``agreement_with_measured_top1`` is 1 - |top-1 observed after the switch - the measured
   top-1 of the variant that answered| (1.0: the backup answers exactly as the profile says).

The last line is one JSON object: ``variants`` (one entry per shipped variant) and ``failover``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.model_import import import_family  # noqa: E402
from agent.profiler import ProfileSettings  # noqa: E402
from deploy.samples import LabelledSamples, check  # noqa: E402
from deploy.testbed import Testbed, wait_until  # noqa: E402
from deploy.topology import make_topology  # noqa: E402
from model_repo.digits import FAMILY, MANIFEST_NAME, train_digits  # noqa: E402
from understudy.client import ClientError, UnderstudyClient  # noqa: E402

SERVERS, SITES, APPS, CRITICAL, HEADROOM = 2, 2, 2, 1.0, 0.4


def profile_family(digits_dir: Path, store: Path, work: Path,
                   settings: ProfileSettings, device: str) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    training = train_digits(digits_dir)
    trained_s = time.perf_counter() - started
    outcome = import_family(digits_dir / MANIFEST_NAME, store, work, settings, force=True,
                            device=device)
    variants = {}
    for result in outcome.results:
        m = result.measurement
        name = result.manifest.variant
        variants[name] = {
            "format": result.manifest.format,
            "size_mb": result.manifest.weights_mb,
            "top1": result.top1,
            "accuracy_source": "measured" if result.top1 is not None else "declared",
            "top1_at_training": training["variants"][name]["top1"],
            "load_ms": round(m.load_s * 1000.0, 3),
            "memory_mb": round(max(m.resident_mb or 0.0, m.weights_mb) + (m.device_mb or 0.0),
                               3),
            "resident_mb": m.resident_mb,
            "latency_ms_b1": round(m.latency_p50_ms, 4),
            "latency_ms_p99_b1": round(m.latency_p99_ms, 4),
            "latency_ms_by_batch": m.latency_ms_by_batch,
            "device": m.device or "cpu",
        }
    return variants, trained_s


def pass_over(client: UnderstudyClient, samples: LabelledSamples) -> dict[str, Any]:
    """Send every sample once; top-1 per variant that answered."""
    correct: dict[str, list[int]] = {}
    for index in range(len(samples)):
        result = client.infer(samples.inputs[index:index + 1], timeout_s=60.0)
        counts = correct.setdefault(str(result.record.variant), [0, 0])
        counts[0] += 1
        counts[1] += check(result.logits, int(samples.labels[index]))["correct"]
    return {v: {"checked": c[0], "top1": c[1] / c[0]} for v, c in correct.items()}


class Sender(threading.Thread):
    """Keeps sending labelled digits at a fixed rate; counts answers, failures, correct ones."""

    def __init__(self, client: UnderstudyClient, samples: LabelledSamples, rate: float) -> None:
        super().__init__(name="digits-sender", daemon=True)
        self.client, self.samples, self.interval = client, samples, 1.0 / rate
        self.stop = threading.Event()
        self.answered = self.failed = self.correct = 0
        self.longest_s = 0.0

    def run(self) -> None:
        while not self.stop.is_set():
            image, label = self.samples.next()
            try:
                result = self.client.infer(image, timeout_s=60.0)
            except ClientError:
                self.failed += 1
                continue
            self.answered += 1
            self.correct += check(result.logits, label)["correct"]
            self.longest_s = max(self.longest_s, result.record.latency_s)
            self.stop.wait(self.interval)


def live_failover(store: Path, run_dir: Path, variants: dict[str, Any],
                  rate: float) -> dict[str, Any]:
    topology = replace(make_topology(SERVERS, SITES, APPS, CRITICAL, HEADROOM),
                       families=(FAMILY,))
    bed = Testbed.up(run_dir, topology, artifacts=store, clients=False, timeout_s=300)
    try:
        app_id = bed.state.apps[0]["app_id"]
        # The warm plan follows the registration a moment later: wait for the app's backup.
        wait_until("the app's warm backup",
                   lambda: bed.http.get(f"/v1/apps/{app_id}").json()["backups"], 180, 0.1)
        bed.wait_converged(180)
        app = bed.http.get(f"/v1/apps/{app_id}").json()
        home, home_variant = app["serving"]["server_id"], app["serving"]["variant"]
        backups = [b["variant"] for b in app["backups"]]
        samples = LabelledSamples.from_store(store, FAMILY, seed=1)
        assert samples is not None  # noqa: S101 - the import copied the evaluation set
        with UnderstudyClient(bed.state.controller_url, app_id,
                              token_file=bed.token_file("client")) as client:
            before = pass_over(client, samples)
            sender = Sender(client, samples, rate)
            sender.start()
            time.sleep(2.0)
            killed_at = bed.fail([home])

            def moved() -> bool:
                serving = bed.http.get(f"/v1/apps/{app_id}").json()["serving"]
                return serving is not None and serving["server_id"] != home

            wait_until("the app to serve from another server", moved, 120, 0.02)
            switched_s = time.time() - killed_at
            time.sleep(2.0)
            sender.stop.set()
            sender.join(70)
            after = pass_over(client, samples)
    finally:
        bed.down()
    # The variant that answered most of the pass after the switch (normally the only one).
    after_variant, observed = max(after.items(), key=lambda item: item[1]["checked"])
    measured = variants[after_variant]["top1"]
    checked = sum(v["checked"] for v in (*before.values(), *after.values()))
    return {
        "app": app_id, "home_variant": home_variant, "warm_backups": backups,
        "variant_after_switch": after_variant,
        "predictions_checked": checked + sender.answered,
        "predictions_checked_after_switch": sum(v["checked"] for v in after.values()),
        "top1_before_switch": {v: round(x["top1"], 6) for v, x in before.items()},
        "top1_after_switch": round(observed["top1"], 6),
        "measured_top1_of_that_variant": measured,
        "agreement_with_measured_top1": round(1.0 - abs(observed["top1"] - measured), 6),
        "during_failover": {"answered": sender.answered, "failed": sender.failed,
                            "top1": round(sender.correct / sender.answered, 6)
                            if sender.answered else None,
                            "longest_request_s": round(sender.longest_s, 4)},
        "serving_elsewhere_after_kill_s": round(switched_s, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--digits-dir", type=Path, default=REPO / "runs" / "digits")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0,
                        help="requests/s of the client thread during the failover")
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="real-models-") as scratch:
        root = Path(scratch)
        settings = ProfileSettings(repeats=options.repeats, latency_requests=options.requests)
        variants, trained_s = profile_family(options.digits_dir, root / "store", root / "work",
                                             settings, options.device)
        for name, figures in variants.items():
            print(f"{name:16} {figures['format']:11} top-1 {figures['top1']:.4f}  load "
                  f"{figures['load_ms']:7.2f} ms  memory {figures['memory_mb']:6.2f} MB  "
                  f"p50 b1 {figures['latency_ms_b1']:5.2f} ms", flush=True)
        failover = live_failover(root / "store", root / "testbed", variants, options.rate)
    print(f"failover: {failover['home_variant']} -> {failover['variant_after_switch']}, "
          f"{failover['predictions_checked']} predictions checked, top-1 after the switch "
          f"{failover['top1_after_switch']:.4f} (measured "
          f"{failover['measured_top1_of_that_variant']:.4f})", flush=True)
    print(json.dumps({"family": FAMILY, "variants": variants, "failover": failover,
                      "training_s_or_cached": round(trained_s, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
