"""Latency the inference gateway adds, against calling the same Triton model directly.

Usage: ``python bench/gateway_latency.py [--requests 2000] [--warmup 200]``.

One Triton (the wheel's, Python backend) serves two models of app-shaped signatures: ``image``
(an FP32 [1,3,224,224] image in, [1,1000] logits out, as the apps' models) and ``small`` (16
floats in and out: the gateway's fixed cost alone). An ``understudy gateway`` process routes the
apps ``bench-image`` and ``bench-small`` to them from a routing table written in its run
directory, with no controller reachable (the table a gateway keeps across restarts), so nothing
but the request path is measured. One client sends the same pre-encoded request (the binary
tensor extension, as tritonclient sends it) alternately through the gateway, through a second
gateway that reads every body whole before sending it on (``--cut-through-kib 0``:
store-and-forward, the A/B of cut-through) and directly, one at a time on keep-alive
connections, and times each. Reported per model: the median and p99 of each path and of its
difference with the direct one, in milliseconds, and the gateway's CPU time per request. The
image model is measured again with its body paced as a client on a ``--link-mbps`` (1000) link
would send it (64 KiB at a time), and over gRPC with ``tritonclient.grpc`` on both paths. The
last line is one JSON object whose ``gateway_added_latency_p50_ms`` is the image model's median
difference over HTTP on the loopback; ``paced_*`` are the paced client's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.triton import TritonServer  # noqa: E402
from agent.triton_config import TritonConfig  # noqa: E402
from understudy.client import Location  # noqa: E402
from understudy.wire.ports import free_ports  # noqa: E402

MODEL_PY = '''
import os, sys
sys.path[:0] = [p for p in os.environ.get("UNDERSTUDY_PYTHONPATH", "").split(os.pathsep) if p]
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.out = 1000 if "image" in args["model_name"] else 16

    def execute(self, requests):
        replies = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            y = np.ascontiguousarray(x.reshape(x.shape[0], -1)[:, :self.out])
            replies.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", y)]))
        return replies
'''

MODELS = {"image": [1, 3, 224, 224], "small": [1, 16]}


def write_repository(root: Path) -> None:
    """The two Python-backend models, named as the gateway expects (``<app>__<variant>``)."""
    for variant, shape in MODELS.items():
        name = f"bench-{variant}__{variant}"
        out = 1000 if variant == "image" else 16
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(MODEL_PY)
        dims = ", ".join(str(d) for d in [-1, *shape[1:]])
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1, {out} ] }} ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n')


PACED_CHUNK = 64 * 1024
"""Bytes the paced client sends at a time."""


def write_routes(run_dir: Path, triton: TritonServer) -> None:
    """A gateway routing table sending each bench app to its model on this Triton."""
    apps = {}
    for variant in MODELS:
        app_id = f"bench-{variant}"
        location = Location(http=triton.config.http_url, grpc=triton.config.grpc_url,
                            model_name=f"{app_id}__{variant}", server_id="bench",
                            variant=variant, accuracy=1.0, seq=1)
        apps[app_id] = {"serving": asdict(location), "backups": [], "seq": 1, "reason": ""}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "routes.json").write_text(json.dumps({"version": 1, "last_seq": 1,
                                                      "apps": apps}))


def encoded_request(shape: list[int]) -> tuple[bytes, dict[str, str]]:
    """A binary-extension infer request of random floats, and its headers."""
    import numpy as np

    data = np.random.default_rng(0).random(shape, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "INPUT", "shape": shape, "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}]
                         }).encode()
    return header + data, {"Content-Type": "application/octet-stream",
                           "Inference-Header-Content-Length": str(len(header))}


def start_gateway(run_dir: Path, port: int, grpc_port: int, dead_controller_port: int,
                  *extra: str) -> subprocess.Popen[bytes]:
    log = (run_dir / "gateway.log").open("ab")
    process = subprocess.Popen(  # noqa: S603 - our own CLI
        [sys.executable, "-m", "understudy.cli.main", "--log-level", "WARNING", "gateway",
         "--controller-url", f"http://127.0.0.1:{dead_controller_port}", "--port", str(port),
         "--grpc-port", str(grpc_port), "--run-dir", str(run_dir), *extra], cwd=REPO,
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/v2/health/ready")
            if connection.getresponse().status == 200:
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the gateway did not become ready")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send_paced(connection: http.client.HTTPConnection, path: str, body: bytes,
               headers: dict[str, str], link_mbps: float) -> None:
    """The head, then the body in chunks, each sent once a link of ``link_mbps`` would have
    carried it (a client on another machine: its body arrives over milliseconds)."""
    connection.putrequest("POST", path, skip_accept_encoding=True)
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders()
    start = time.perf_counter()
    for offset in range(0, len(body), PACED_CHUNK):
        end = min(len(body), offset + PACED_CHUNK)
        due = start + end * 8 / (link_mbps * 1e6)
        while (wait := due - time.perf_counter()) > 0:
            time.sleep(wait if wait > 2e-4 else 0)
        connection.send(body[offset:end])


def measure(gateways: dict[str, int], direct: int, variant: str, requests: int, warmup: int,
            gateway_pid: int, link_mbps: float | None = None) -> dict[str, float]:
    """Alternate requests through each gateway and direct; per-path and per-pair figures (ms).

    ``gateways``: name -> port; the first is the one whose CPU time is reported and whose
    figures keep the plain names (``gateway_p50_ms``, ``added_p50_ms``); the others' carry
    their name as a prefix. ``link_mbps``: bodies sent at that rate (:func:`send_paced`).
    """
    body, headers = encoded_request(MODELS[variant])
    paths = {name: (port, f"/v2/models/bench-{variant}/infer")
             for name, port in gateways.items()}
    paths["direct"] = (direct, f"/v2/models/bench-{variant}__{variant}/infer")
    connections = {k: http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                   for k, (port, _) in paths.items()}
    times: dict[str, list[float]] = {key: [] for key in paths}
    order = list(paths)
    cpu_before = 0.0
    for i in range(warmup + requests):
        if i == warmup:
            cpu_before = cpu_s(gateway_pid)
        random.shuffle(order)  # no path always goes first
        for key in order:
            connection, path = connections[key], paths[key][1]
            started = time.perf_counter()
            if link_mbps is None:
                connection.request("POST", path, body, headers)
            else:
                send_paced(connection, path, body, headers, link_mbps)
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                raise RuntimeError(f"{key} {variant}: HTTP {response.status}")
            if i >= warmup:
                times[key].append(elapsed * 1000)
    gateway_cpu_s = cpu_s(gateway_pid) - cpu_before
    direct_ms = times["direct"]
    figures = {"gateway_cpu_ms_per_request": gateway_cpu_s * 1000 / requests,
               "direct_p50_ms": statistics.median(direct_ms), "direct_p99_ms": _p99(direct_ms)}
    for index, name in enumerate(gateways):
        prefix = "" if index == 0 else f"{name}_"
        through = times[name]
        added = [g - d for g, d in zip(through, direct_ms, strict=True)]
        figures.update({
            f"{prefix}gateway_p50_ms": statistics.median(through),
            f"{prefix}gateway_p99_ms": _p99(through),
            f"{prefix}added_p50_ms": statistics.median(through) - statistics.median(direct_ms),
            f"{prefix}added_pair_p50_ms": statistics.median(added),
            f"{prefix}added_p99_ms": _p99(through) - _p99(direct_ms)})
    return figures


def measure_grpc(gateway: str, direct: str, variant: str, requests: int, warmup: int
                 ) -> dict[str, float]:
    """The same comparison over gRPC, with tritonclient.grpc on both paths."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    data = np.random.default_rng(0).random(MODELS[variant], dtype=np.float32)
    clients = {"gateway": (grpcclient.InferenceServerClient(gateway), f"bench-{variant}"),
               "direct": (grpcclient.InferenceServerClient(direct),
                          f"bench-{variant}__{variant}")}
    times: dict[str, list[float]] = {"gateway": [], "direct": []}
    order = list(clients)
    for i in range(warmup + requests):
        random.shuffle(order)
        for key in order:
            client, model = clients[key]
            tensor = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            started = time.perf_counter()
            client.infer(model, [tensor])
            if i >= warmup:
                times[key].append((time.perf_counter() - started) * 1000)
    return {"gateway_p50_ms": statistics.median(times["gateway"]),
            "direct_p50_ms": statistics.median(times["direct"]),
            "added_p50_ms": statistics.median(times["gateway"]) - statistics.median(
                times["direct"]),
            "added_p99_ms": _p99(times["gateway"]) - _p99(times["direct"])}


def _p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per path and model")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--link-mbps", type=float, default=1000.0,
                        help="the paced client's link rate (the image body over a LAN)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gateway-latency-") as scratch:
        root = Path(scratch)
        write_repository(root / "repository")
        (http_port, grpc_port, metrics_port, gateway_port, gateway_grpc, dead, store_port,
         store_grpc) = free_ports(8)
        triton = TritonServer(TritonConfig(
            model_repository=root / "repository", work_dir=root / "triton",
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
            use_runtime=False, model_backend="python"))
        triton.start()
        started: list[subprocess.Popen[bytes]] = []
        try:
            for variant in MODELS:
                triton.load(f"bench-{variant}__{variant}")
            write_routes(root / "gateway", triton)
            write_routes(root / "store-forward", triton)
            gateway = start_gateway(root / "gateway", gateway_port, gateway_grpc, dead)
            started.append(gateway)
            # The same gateway reading every body whole before sending it on (A/B).
            started.append(start_gateway(root / "store-forward", store_port, store_grpc, dead,
                                         "--cut-through-kib", "0"))
            gateways = {"gateway": gateway_port, "store_forward": store_port}
            results = {v: measure(gateways, http_port, v, args.requests, args.warmup,
                                  gateway.pid) for v in MODELS}
            paced = measure(gateways, http_port, "image", args.requests // 2, args.warmup // 2,
                            gateway.pid, link_mbps=args.link_mbps)
            grpc = measure_grpc(f"127.0.0.1:{gateway_grpc}", triton.config.grpc_url, "image",
                                args.requests, args.warmup)
        finally:
            for process in started:
                process.send_signal(signal.SIGTERM)
                process.wait(10)
            triton.stop()
    for variant, figures in results.items():
        print(f"{variant}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    print(f"image at {args.link_mbps:g} Mb/s: "
          + ", ".join(f"{k} {v:.3f}" for k, v in paced.items()))
    print("grpc image: " + ", ".join(f"{k} {v:.3f}" for k, v in grpc.items()))
    image, small = results["image"], results["small"]
    print(json.dumps({
        "gateway_added_latency_p50_ms": round(image["added_p50_ms"], 3),
        "gateway_added_latency_p99_ms": round(image["added_p99_ms"], 3),
        "gateway_added_latency_pair_p50_ms": round(image["added_pair_p50_ms"], 3),
        "gateway_p50_ms": round(image["gateway_p50_ms"], 3),
        "direct_p50_ms": round(image["direct_p50_ms"], 3),
        "small_added_latency_p50_ms": round(small["added_p50_ms"], 3),
        "small_added_latency_p99_ms": round(small["added_p99_ms"], 3),
        "small_direct_p50_ms": round(small["direct_p50_ms"], 3),
        "gateway_cpu_ms_per_request": round(image["gateway_cpu_ms_per_request"], 3),
        "small_gateway_cpu_ms_per_request": round(small["gateway_cpu_ms_per_request"], 3),
        "grpc_added_latency_p50_ms": round(grpc["added_p50_ms"], 3),
        "grpc_added_latency_p99_ms": round(grpc["added_p99_ms"], 3),
        "grpc_direct_p50_ms": round(grpc["direct_p50_ms"], 3),
        "store_forward_added_latency_p50_ms": round(image["store_forward_added_p50_ms"], 3),
        "paced_link_mbps": args.link_mbps,
        "paced_direct_p50_ms": round(paced["direct_p50_ms"], 3),
        "paced_added_latency_p50_ms": round(paced["added_p50_ms"], 3),
        "paced_store_forward_added_latency_p50_ms": round(
            paced["store_forward_added_p50_ms"], 3),
        "requests": args.requests, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
