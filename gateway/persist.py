"""The routing table on disk: a gateway restarted while the controller is down still routes."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from gateway.routes import RoutingTable

logger = logging.getLogger(__name__)

TABLE_FILE = "routes.json"


def load_table(path: Path) -> RoutingTable | None:
    """The table persisted at ``path``; None when there is none or it cannot be read."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return RoutingTable.from_doc(doc)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring the routing table in %s: %s", path, exc)
        return None


def save_doc(doc: dict[str, Any], path: Path) -> None:
    """Write a table's document atomically (a crash leaves the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, path)
