"""Parity models end to end on real processes: a testbed (Redis, controller, agents with Triton),
the digits family and its parity model in the artifact store, an app registered with
``"protection": "parity:2"``, and ``understudy gateway`` in front. The server of one of the app's
instances is SIGKILLed: the queries it held come back reconstructed from the parity model's
output, marked as such, and the controller places the lost instance again. A query held by a
frozen instance with no other query to complete its group is rebuilt at once, its group filled
with queries answered before."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from deploy.parity_bed import (
    FAMILY,
    GatewayProcess,
    prepare_store,
    register,
    servers_of,
    start_gateway,
    wait_protected,
)
from deploy.processes import signal_group
from deploy.samples import LabelledSamples
from deploy.testbed import Testbed, wait_until
from deploy.topology import make_topology
from parity.training import TrainingSettings

pytestmark = pytest.mark.timeout(600)
VARIANT = "digits_cnn"
APP = "parm"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parity-store") / "artifacts"
    # A working parity model, not the most accurate one (bench/parm_accuracy.py measures that):
    # trained shorter, into a folder of its own so that runs/parity keeps the full model.
    names = prepare_store(path, VARIANT, [2], parity_dir=path.parent / "parity",
                          settings=TrainingSettings(steps=1500, validate_every=250, patience=4))
    assert names == [f"{VARIANT}_parity_k2"]
    return path


@pytest.fixture(scope="module")
def bed(store: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    topology = replace(make_topology(servers=4, sites=2, apps=0), families=(FAMILY,))
    testbed = Testbed.up(tmp_path_factory.mktemp("parity-bed"), topology, artifacts=store,
                         clients=False, register=False, timeout_s=300)
    try:
        yield testbed
    finally:
        testbed.down()


@pytest.fixture(scope="module")
def gateway(bed: Testbed, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayProcess]:
    # Reconstruct only what fails (a slow answer on this shared machine must not count), and
    # keep groups open long enough for the pairs this test sends.
    process = start_gateway(tmp_path_factory.mktemp("parity-gateway"),
                            bed.state.controller_url, "--straggler-ms", f"{APP}=5000",
                            "--group-timeout-ms", "3000",
                            token_file=bed.token_file("gateway"))
    try:
        yield process
    finally:
        process.stop()


def infer(gateway: GatewayProcess, image: np.ndarray, app_id: str = APP) -> httpx.Response:
    body = {"inputs": [{"name": "image", "shape": list(image.shape), "datatype": "FP32",
                        "data": image.ravel().tolist()}]}
    return httpx.post(f"{gateway.url}/v2/models/{app_id}/infer", json=body, timeout=30)


def pair(gateway: GatewayProcess, samples: LabelledSamples, app_id: str = APP
         ) -> list[tuple[httpx.Response, int]]:
    """Two queries at once (one coding group of k = 2), with their labels."""
    inputs = [samples.next() for _ in range(2)]
    replies: list[Any] = [None, None]

    def send(index: int) -> None:
        replies[index] = infer(gateway, inputs[index][0], app_id)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return [(reply, label) for reply, (_, label) in zip(replies, inputs, strict=True)]


def logits(reply: httpx.Response) -> np.ndarray:
    return np.asarray(reply.json()["outputs"][0]["data"], dtype=np.float32)


def test_a_killed_instance_is_answered_by_reconstruction(bed: Testbed, store: Path,
                                                         gateway: GatewayProcess) -> None:
    view = register(bed, APP, VARIANT, protection="parity:2")
    roles = servers_of(view)
    instance_servers = {*roles["serving"], *roles["instance"]}
    assert len(instance_servers) == 2 and roles["parity"][0] not in instance_servers
    samples = LabelledSamples.from_store(store, FAMILY, seed=3)
    assert samples is not None

    def coded() -> bool:  # the gateway knows the instances and the parity model
        for reply, _ in pair(gateway, samples):
            assert reply.status_code == 200, reply.text
        return gateway.total("understudy_gateway_parity_queries_total", 'outcome="answered"') > 0

    wait_until("a coding group decoded by the parity model", coded, 60, 0.1)
    assert gateway.total("understudy_gateway_reconstructions_total") == 0

    # The instance's server freezes (SIGSTOP: agent and Triton), so the queries the gateway sends
    # it hang until the controller declares it failed: those are answered by reconstruction.
    # (After a SIGKILL the gateway could learn of the failure before the next query went out,
    # and send none there.) Then it is killed for good.
    killed = roles["instance"][0]
    signal_group(bed.state.processes[f"agent-{killed}"], signal.SIGSTOP)
    try:
        answers = [answer for _ in range(10) for answer in pair(gateway, samples)]
    finally:
        bed.fail([killed])
    assert all(reply.status_code == 200 for reply, _ in answers), \
        [reply.text for reply, _ in answers if reply.status_code != 200]
    rebuilt = [(reply, label) for reply, label in answers
               if reply.headers.get("understudy-answer") == "reconstructed"]
    assert rebuilt, "no answer was reconstructed after the instance's server was killed"
    for reply, _ in rebuilt:
        assert reply.headers["understudy-reconstructed"] == "true"
        assert reply.headers["understudy-coding-group"]
        doc = reply.json()
        assert doc["parameters"]["understudy_answer"] == "reconstructed"
        assert doc["model_name"] == APP and doc["outputs"][0]["shape"] == [1, 10]
    correct = sum(int(np.argmax(logits(reply))) == label for reply, label in rebuilt)
    assert correct >= len(rebuilt) / 2, json.dumps([logits(r).tolist() for r, _ in rebuilt])
    assert gateway.total("understudy_gateway_reconstructions_total",
                         'cause="failed"') == len(rebuilt)

    # Its own failover: the lost instance is placed again, the parity model stays apart.
    wait_until("the killed server's instance forgotten", lambda: killed not in {
        r["server_id"] for r in bed.http.get(f"/v1/apps/{APP}").json()["replicas"]}, 60, 0.1)
    after = servers_of(wait_protected(bed, APP, timeout_s=120))
    assert killed not in {*after["serving"], *after["instance"], *after["parity"]}
    assert after["parity"][0] not in {*after["serving"], *after["instance"]}
    for reply, _ in pair(gateway, samples):
        assert reply.status_code == 200


def test_a_query_on_a_frozen_instance_fills_its_group_and_is_rebuilt_at_once(
        bed: Testbed, store: Path, gateway: GatewayProcess) -> None:
    # An app with the gateway's defaults: a late prediction is rebuilt as soon as it can be,
    # and a query unanswered 5 ms after its send fills its open group with answered queries.
    app_id = "parm-fill"
    roles = servers_of(register(bed, app_id, VARIANT, protection="parity:2"))
    samples = LabelledSamples.from_store(store, FAMILY, seed=5)
    assert samples is not None

    def coded() -> bool:  # answered queries to fill with, and a parity model that answers
        for reply, _ in pair(gateway, samples, app_id):
            assert reply.status_code == 200, reply.text
        return gateway.total("understudy_gateway_parity_queries_total",
                             f'app_id="{app_id}",outcome="answered"') > 0

    wait_until("a coding group decoded by the parity model", coded, 60, 0.1)
    filled_before = gateway.total("understudy_gateway_coding_groups_total",
                                  f'app_id="{app_id}",outcome="filled"')
    frozen = next(s for s in (*roles["serving"], *roles["instance"]) if s != roles["parity"][0])
    agent = bed.state.processes[f"agent-{frozen}"]
    # One query at a time, each after the last one's group timed out (3 s here): a query the
    # frozen instance holds is alone in its group, and is rebuilt only through a filled group
    # (without one it would wait for the group timeout and a resend). The server is frozen
    # only while a query is out, so that the controller does not declare it failed.
    rebuilt = None
    for _ in range(6):
        time.sleep(3.2)
        image, _label = samples.next()
        signal_group(agent, signal.SIGSTOP)
        try:
            started = time.monotonic()
            reply = infer(gateway, image, app_id)
            took_s = time.monotonic() - started
        finally:
            signal_group(agent, signal.SIGCONT)
        assert reply.status_code == 200, reply.text
        if reply.headers.get("understudy-answer") == "reconstructed":
            rebuilt = (reply, took_s)
            break
    assert rebuilt is not None, "no query was held by the frozen instance"
    reply, took_s = rebuilt
    assert took_s < 1.5, f"rebuilt after {took_s:.2f} s: it waited for its group"
    assert reply.json()["outputs"][0]["shape"] == [1, 10]
    assert gateway.total("understudy_gateway_coding_groups_total",
                         f'app_id="{app_id}",outcome="filled"') > filled_before
