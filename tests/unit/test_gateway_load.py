"""The gateway load clients' pure parts: request encoding, reply decoding, the paced loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from deploy.gateway_load import decode_output, encode_infer, paced, records_path, stamp


def test_an_encoded_request_carries_its_tensor_after_the_json_header() -> None:
    array = np.arange(6, dtype=np.float32).reshape(1, 6)
    body, headers = encode_infer(array, "x", "y")
    length = int(headers["Inference-Header-Content-Length"])
    header = json.loads(body[:length])
    assert header["inputs"][0]["shape"] == [1, 6]
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 24
    assert header["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]
    assert np.array_equal(np.frombuffer(body[length:], dtype=np.float32), array.ravel())


def test_decode_output_reads_the_named_binary_output_past_the_others() -> None:
    first = np.ones(3, dtype=np.float32)
    logits = np.array([0.1, 0.9, 0.3], dtype=np.float32)
    header = json.dumps({"outputs": [
        {"name": "other", "datatype": "FP32", "shape": [1, 3],
         "parameters": {"binary_data_size": 12}},
        {"name": "logits", "datatype": "FP32", "shape": [1, 3],
         "parameters": {"binary_data_size": 12}}]}).encode()
    body = header + first.tobytes() + logits.tobytes()
    decoded = decode_output(body, len(header), "logits")
    assert decoded is not None and np.array_equal(decoded, logits)
    assert decode_output(body, len(header), "missing") is None


def test_decode_output_reads_json_data_and_refuses_garbage() -> None:
    body = json.dumps({"outputs": [{"name": "logits", "data": [1, 2]}]}).encode()
    decoded = decode_output(body, None, "logits")
    assert decoded is not None and decoded.tolist() == [1.0, 2.0]
    assert decode_output(b"not json", None, "logits") is None


def test_paced_writes_a_line_per_request_and_ends_unrecorded_when_cut(tmp_path: Path) -> None:
    stop = threading.Event()
    answers: list[dict[str, Any] | None] = [
        stamp("a", "gateway", 1000.0, 1.0, 2.0, "ok", server_id="s1", variant="v"),
        stamp("a", "gateway", 1000.0, 2.0, 3.0, "lost", error="reset"), None]
    path = records_path(tmp_path, "a", "gateway", 1000.0)
    assert path.name == "a.gateway-1000rps.jsonl"
    sent = paced(lambda: answers.pop(0), 1000.0, path, stop)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sent == 2 and [r["outcome"] for r in lines] == ["ok", "lost"]
    assert lines[0]["ok"] and not lines[1]["ok"] and lines[1]["error"] == "reset"
    assert {r["via"] for r in lines} == {"gateway"} and lines[0]["server_id"] == "s1"
