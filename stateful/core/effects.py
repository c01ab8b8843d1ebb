"""Effects the protocol cores return; the simulator and the process runtime carry them out.

Executor contract (both runtimes honour it, the cores rely on it):

- ``Compute``, ``Update`` and ``LoadState`` run one at a time, in the order they were returned
  (one model worker). ``Retrieve`` may run at the same time as a ``Compute``: the compute phase
  only reads the state (HAMS §II-B, §IV-B), and the cores never return ``Update`` while a
  ``Retrieve`` of the previous state is still running.
- Completions come back through the node's ``on_compute_done`` / ``on_update_done`` /
  ``on_retrieved`` with the ``generation`` of the effect; a node drops completions of an older
  generation (after a rollback or a role change).
- ``Send`` is reliable and FIFO per (source, destination) pair while both ends live (TCP, or the
  simulator's retransmitting links); a crash may lose what is in flight, which recovery resends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import BaseModel

from stateful.messages import Payload, RequestMeta


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One request of a batch as the model sees it: inputs ordered by predecessor name."""

    request_id: int
    seq: int
    meta: RequestMeta
    inputs: tuple[Payload, ...]


@dataclass(frozen=True, slots=True)
class Send:
    dst: str
    msg: BaseModel


@dataclass(frozen=True, slots=True)
class Compute:
    """Run the model's read-only compute phase on a batch; returns one output per item."""

    generation: int
    batch_no: int
    items: tuple[BatchItem, ...]


@dataclass(frozen=True, slots=True)
class Update:
    """Run the update phase of batch ``batch_no`` (stateful operators only)."""

    generation: int
    batch_no: int


@dataclass(frozen=True, slots=True)
class Retrieve:
    """Copy the model's complete state (as after ``batch_no``'s update) without stopping it."""

    generation: int
    batch_no: int


@dataclass(frozen=True, slots=True)
class LoadState:
    """Build ``op``'s model if needed and overwrite its state (``None``: the initial state)."""

    generation: int
    op: str
    tensors: Mapping[str, Payload] | None


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Call the node's ``on_timer(key)`` after ``delay_s`` (re-arming replaces nothing)."""

    key: str
    delay_s: float


@dataclass(frozen=True, slots=True)
class Observe:
    """A fact for the consistency checker (``stateful.checker``)."""

    event: BaseModel


@dataclass(frozen=True, slots=True)
class Reply:
    """The frontend releases the reply of a client request."""

    request_id: int
    outputs: Mapping[str, Payload]


@dataclass(frozen=True, slots=True)
class Kill:
    """The manager fences a replica it declared failed (STONITH before promotion)."""

    node: str


@dataclass(frozen=True, slots=True)
class LaunchSpare:
    """The manager wants one more blank standby replica process."""

    count: int = 1


@dataclass(frozen=True, slots=True)
class RecoveryDone:
    """The manager finished a recovery (for metrics, tests and the runtime's waiters)."""

    recovery: int
    failed: tuple[str, ...]
    promoted: tuple[str, ...]
    rolled_back: tuple[str, ...]
    restarted: tuple[str, ...]
    started_at: float
    finished_at: float


Effect = (Send | Compute | Update | Retrieve | LoadState | StartTimer | Observe | Reply | Kill
          | LaunchSpare | RecoveryDone)
