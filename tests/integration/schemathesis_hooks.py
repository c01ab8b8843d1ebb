"""Schemathesis hooks for ``test_fuzz_api`` (loaded through ``SCHEMATHESIS_HOOKS``).

Schemathesis draws ``Idempotency-Key`` values from a small pool, so most mutating requests would
reuse a key already spent on another request and be refused (422) before their route ran. Each
call gets a fresh key instead, when it had a valid one; invalid keys are left alone, so that their
refusal is tested too.
"""

from __future__ import annotations

import uuid
from typing import Any

import schemathesis

from controller.idempotency import KEY_PATTERN


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    headers = case.headers or {}
    for name in [n for n in headers if n.lower() == "idempotency-key"]:
        if isinstance(headers[name], str) and KEY_PATTERN.match(headers[name]):
            headers[name] = uuid.uuid4().hex
