"""Reading a parity model's name back (``parity.artifacts.parity_name`` writes it).

The name is ``<variant>_parity_k<k>``, with ``_concat`` for the concatenation encoder.

The controller places a parity model under that name for an app protected with ``parity:k``;
the gateway reads k and the encoder back from the name of the parity model it is told of. (Kept
apart from ``parity.artifacts``, whose source is part of every trained model's cache key.)
"""

from __future__ import annotations

import re

from parity.coding import EncoderKind

_PARITY_NAME = re.compile(r"^(?P<variant>.+)_parity_k(?P<k>[0-9]+)(?P<concat>_concat)?$")


def parse_parity_name(name: str) -> tuple[str, int, EncoderKind] | None:
    """(deployed variant, k, encoder) of a parity model's name; None for any other name."""
    match = _PARITY_NAME.match(name)
    if match is None or int(match["k"]) < 2:
        return None
    kind = EncoderKind.CONCATENATION if match["concat"] else EncoderKind.ADDITION
    return match["variant"], int(match["k"]), kind
