"""The bounds every value from the wire keeps: finite numbers, short safe ids, bounded text.

Shared by the agent protocol (``understudy.wire.protocol``) and the controller's records and
request bodies (``controller.records``), so that what an agent may say in a hello is exactly what
a server record may hold, and what an API body may say is what an app record may hold: a frame or
a body passes these checks or is refused whole, and nothing unchecked reaches Redis.

Why each bound: a NaN or infinite capacity was stored as ``null`` (pydantic writes non-finite
floats so) and every later read of the record failed; an empty server id made every placement
fail; ids end up in Redis keys and in Triton model names (``<app>__<variant>``), so they keep to
a charset that is safe in both, and short.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""Ids and names: letters, digits, ``_ . -``, not starting with a symbol (no ``/``, no ``*``)."""
MODEL_NAME_SEPARATOR = "__"
"""Separates the app id and the variant in a Triton model name."""
MAX_ID_CHARS = 128
MAX_TEXT_CHARS = 256
"""Short free text: a server type, an error code, a command kind."""
MAX_MESSAGE_CHARS = 8192
"""An error message from an agent (longer ones are cut, not refused: see :data:`Message`)."""
MAX_URL_CHARS = 2048
MAX_CAPACITY = 1e9
"""Largest amount of one resource on one server (1e9 ``memory_mb`` is a petabyte)."""
MAX_RESOURCES = 32
MAX_DURATION_S = 1e6
MAX_TIMESTAMP = 1e11
"""Seconds since the epoch (the year 5138): anything later is a bogus clock or an attack."""
MIN_HEARTBEAT_MS = 1.0
MAX_HEARTBEAT_MS = 60_000.0
_NAME = re.compile(NAME_PATTERN)


def check_name(value: str, what: str = "name") -> str:
    """``value`` when it is a valid id part of a model name; ValueError naming ``what`` if not."""
    if not _NAME.match(value) or MODEL_NAME_SEPARATOR in value or \
            len(value) > MAX_ID_CHARS:
        raise ValueError(f"{what} {value[:MAX_ID_CHARS]!r} must be 1 to {MAX_ID_CHARS} letters, "
                         f"digits, '_', '.', '-' (not starting with a symbol, no '__')")
    return value


def _no_separator(value: str) -> str:
    if MODEL_NAME_SEPARATOR in value:
        raise ValueError(f"must not contain {MODEL_NAME_SEPARATOR!r} (it separates app and "
                         f"variant in a model name)")
    return value


def _cut(limit: int) -> Callable[[object], object]:
    def cut(value: object) -> object:
        return value[:limit] if isinstance(value, str) else value
    return cut


Id = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS,
                                      pattern=NAME_PATTERN)]
"""A server, site, graph or node id: 1 to 128 safe characters."""
ModelPart = Annotated[Id, AfterValidator(_no_separator)]
"""An app id or a variant: an :data:`Id` without ``__`` (part of a Triton model name)."""
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=2 * MAX_ID_CHARS + 2,
                                             pattern=NAME_PATTERN)]
"""A Triton model name, ``<app>__<variant>``."""
Token = Annotated[str, StringConstraints(max_length=MAX_ID_CHARS,
                                         pattern=r"^[A-Za-z0-9_.:-]*$")]
"""An opaque token such as a boot id (may be empty)."""
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
Message = Annotated[str, BeforeValidator(_cut(MAX_MESSAGE_CHARS))]
"""Free text from a peer, cut to :data:`MAX_MESSAGE_CHARS` rather than refused: an agent's long
error message must not cost it its connection."""
Url = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_CHARS,
                                       pattern=r"^\S+$")]
"""A URL or ``host:port`` (no whitespace)."""
Capacity = Annotated[float, Field(ge=0, le=MAX_CAPACITY, allow_inf_nan=False)]
Capacities = Annotated[dict[Id, Capacity], Field(max_length=MAX_RESOURCES)]
"""Resource name -> amount, e.g. ``{"memory_mb": 16000, "compute": 100}``."""
Finite = Annotated[float, Field(allow_inf_nan=False)]
Duration = Annotated[float, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False)]
"""Seconds something took."""
Timestamp = Annotated[float, Field(ge=0, le=MAX_TIMESTAMP, allow_inf_nan=False)]
"""Seconds since the epoch."""
HeartbeatIntervalMs = Annotated[float, Field(ge=MIN_HEARTBEAT_MS, le=MAX_HEARTBEAT_MS,
                                             allow_inf_nan=False)]
Pid = Annotated[int, Field(ge=1, le=2**31 - 1)]
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
"""A process's exit status (negative: the signal that ended it)."""
Count = Annotated[int, Field(ge=0, le=2**31 - 1)]
