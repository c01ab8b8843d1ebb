"""One settings object per process: command-line flags, then ``UNDERSTUDY_*``, then defaults.

Precedence, highest first:

1. an explicit command-line flag (argparse leaves the flags not given as ``None``);
2. the environment: ``UNDERSTUDY_<PROCESS>_<FIELD>`` (e.g. ``UNDERSTUDY_CONTROLLER_PORT``,
   ``UNDERSTUDY_AGENT_HEARTBEAT_INTERVAL_MS``), or a variable a field names for itself
   (``ca_file`` reads ``UNDERSTUDY_CA_FILE``; credentials come from
   ``understudy.wire.credentials``: ``UNDERSTUDY_TOKEN_FILE`` or ``UNDERSTUDY_TOKEN``);
3. the settings model's default.

Environment values are validated like flags (the model's types and bounds); a value that starts
with ``{`` or ``[`` is read as JSON (mappings, lists, nested settings). Any ``UNDERSTUDY_*``
variable that no process reads is reported with a warning (a typo would otherwise be silently
ignored), as are a process's own variables that name no field.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

logger = logging.getLogger(__name__)

PREFIX = "UNDERSTUDY_"

PROCESS_PREFIXES = ("UNDERSTUDY_CONTROLLER_", "UNDERSTUDY_AGENT_", "UNDERSTUDY_GATEWAY_")
"""The processes with a settings object; each reads only its own prefix."""

OTHER_VARIABLES = frozenset({
    "UNDERSTUDY_TOKEN",
    "UNDERSTUDY_REDIS_PASSWORD",
    "UNDERSTUDY_TOKEN_FILE",
    "UNDERSTUDY_CA_FILE",
    "UNDERSTUDY_PYTHONPATH",
    "UNDERSTUDY_RUNTIME_SOCKET",
    "UNDERSTUDY_HEAP_HUGE_PAGES",
    "UNDERSTUDY_STARTING_BOOST_S",
    "UNDERSTUDY_MODEL_BACKEND",
    "UNDERSTUDY_NATIVE_CACHE",
    "UNDERSTUDY_NO_PREEMPT",
    "UNDERSTUDY_TRITON_BACKENDS",
    "UNDERSTUDY_TRITON_BIN",
})
"""Variables read outside the settings objects or shared by name (the credential and the CA of
``understudy.wire.credentials``, the controller's Redis password; what a process hands its
children: the model runtime's socket and import path; switches of the model runtime and the
Triton launcher; a test switch)."""

Settings = TypeVar("Settings", bound=BaseModel)


def resolve(model: type[Settings], flags: Mapping[str, Any], env_prefix: str,
            env_names: Mapping[str, str] | None = None,
            environ: Mapping[str, str] | None = None) -> Settings:
    """Build ``model`` from ``flags`` (None = not given), the environment, then defaults.

    ``env_names`` maps a field to a variable of its own (instead of ``env_prefix + FIELD``).
    Raises pydantic's ``ValidationError`` for a bad value, wherever it came from.
    """
    environ = os.environ if environ is None else environ
    env_names = dict(env_names or {})
    values: dict[str, Any] = {}
    for name in model.model_fields:
        flag = flags.get(name)
        if flag is not None:
            values[name] = flag
            continue
        variable = env_names.get(name, env_prefix + name.upper())
        raw = environ.get(variable)
        if raw is None:
            continue
        values[name] = json.loads(raw) if raw.lstrip().startswith(("{", "[")) else raw
    warn_unknown(model, env_prefix, env_names, environ)
    return model.model_validate(values)


def warn_unknown(model: type[BaseModel], env_prefix: str, env_names: Mapping[str, str],
                 environ: Mapping[str, str]) -> list[str]:
    """Warn about ``UNDERSTUDY_*`` variables nothing reads; returns their names."""
    own = {env_names.get(name, env_prefix + name.upper()) for name in model.model_fields}
    unknown = []
    for variable in sorted(environ):
        if not variable.startswith(PREFIX) or variable in own or variable in OTHER_VARIABLES:
            continue
        if variable.startswith(PROCESS_PREFIXES) and not variable.startswith(env_prefix):
            continue  # another process's setting
        unknown.append(variable)
    if unknown:
        logger.warning("ignoring unknown environment variable%s %s (this process reads %s)",
                       "s" if len(unknown) > 1 else "", ", ".join(unknown),
                       ", ".join(sorted(own)))
    return unknown
