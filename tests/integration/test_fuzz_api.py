"""Schemathesis over the controller's own /openapi.json, against a real controller and Redis.

The ``st`` command line runs its examples, coverage and fuzzing phases over every operation:
the coverage phase's boundary and negative cases (values just outside each bound, wrong types,
missing required parts, methods a path does not declare) and Hypothesis-generated paths,
queries, headers and bodies, sent with the admin credential over HTTP. The checks: no 5xx,
every answer conforms to its documented schema, content type and headers, every status
returned is documented, invalid input is refused, a method a path does not declare is a 405
whose ``Allow`` lists exactly the path's methods.

Not checked: that every schema-valid request is accepted (``positive_data_acceptance``). Some
rules are not in the schema: a family must be one the profiles know and the artifact store
holds, a pinned server must exist, a name must be free. Each call gets a fresh
``Idempotency-Key`` (``schemathesis_hooks``), or the pool schemathesis draws keys from would
have most mutating calls refused as reuses before their route ran.

``UNDERSTUDY_FUZZ_EXAMPLES`` sets the generated cases per operation (default 30, which keeps
``make test`` short); the run is deterministic, so a failure found here reproduces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.redis_server import RedisServer
from deploy.sim_driver import ControllerProcess
from tests.integration.hostile_fixtures import artifact_store

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("UNDERSTUDY_FUZZ_EXAMPLES", "30"))
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance",
          "negative_data_rejection", "missing_required_header", "unsupported_method",
          "allow_header_conformance")
MIN_CASES = 10 * EXAMPLES
"""Fewer cases than this means the run did not really happen (a schema it could not load, an
operation it skipped...)."""


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    run_dir = tmp_path_factory.mktemp("fuzz-api")
    redis = RedisServer(run_dir / "redis")
    redis.start()
    process = ControllerProcess(run_dir, log_level="WARNING", extra=[
        "--redis-url", redis.redacted_url, "--redis-password-file", str(redis.password_file),
        "--startup-grace-s", "3600",
        "--artifacts", str(artifact_store(run_dir / "artifacts"))])
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()
        redis.stop()


def test_the_api_answers_as_documented(controller: ControllerProcess, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    st = Path(sys.executable).with_name("st")
    run = subprocess.run(  # noqa: S603 - schemathesis's own command line
        [str(st), "--config-file", str(Path(__file__).with_name("schemathesis.toml")), "run",
         f"{controller.url}/openapi.json", "--checks", ",".join(CHECKS),
         "--phases", "examples,coverage,fuzzing", "--max-examples", str(EXAMPLES),
         "--generation-deterministic", "--seed", "1",
         "--workers", "1", "--request-timeout", "60", "--no-color", "--output-truncate",
         "false", "-H", f"Authorization: {controller.auth['Authorization']}",
         "--generation-with-security-parameters", "false", "--report", "json",
         "--report-json-path", str(report), "--suppress-health-check", "all"],
        cwd=REPO, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": str(REPO),
             "SCHEMATHESIS_HOOKS": "tests.integration.schemathesis_hooks"})
    print(run.stdout, run.stderr)  # shown in full when the test fails
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    summary = json.loads(report.read_text())
    operations, cases = summary["operations"], summary["test_cases"]
    assert operations["tested"] == operations["total"] and not operations["errored"], operations
    assert cases["generated"] >= MIN_CASES and not cases["errored"], cases
    assert not summary["failures"] and not summary["errors"], summary
    # The controller still serves, and nothing it logged was a crash.
    assert controller.popen.poll() is None
    assert controller.http.get("/readyz").status_code == 200
    assert "Traceback" not in controller.log_path.read_text()
