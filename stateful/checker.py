"""Consistency checker: global consistency as HAMS defines it (§I, §IV-F), checked from records.

The cores emit observations (when ``RuntimeOptions.observe`` is on): every output released to a
downstream operator or the frontend, every state a backup applied, every reply released to a
client. Under non-determinism a speculative output can legitimately be re-executed with another
value after a failover — as long as nothing that survives depends on the first value (§IV-C:
"HAMS can safely discard the speculative states"). So the checker judges *committed* outputs: an
output of a stateful operator is committed when a client received a reply whose lineage holds it,
or when a backup applied a state holding it (its producer's own state, or a downstream state
whose lineage holds it; a durable state is never rolled back). It reports:

- ``conflicting_output``: an (operator, seq) committed with two different values (or requests),
  or one request committed at two seqs of an operator (processed twice into surviving state);
- ``never_released``: a committed output that no replica ever released — a recovered state that
  does not descend from released outputs;
- ``conflicting_reply`` / ``duplicate_reply``: a client got two replies for one request;
- ``lost``: requests submitted and never replied (reported separately).

Outputs of stateless operators are not judged: §IV-F lets them diverge on re-execution because
no state depends on them except through a downstream state that is itself checked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from stateful.messages import Lineage, OutputRecord

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ObsRelease(BaseModel):
    type: Literal["release"] = "release"
    model_config = _FROZEN
    op: str
    node: str
    request_id: int
    lineage: Lineage
    dst: str

    @classmethod
    def of(cls, op: str, node: str, record: OutputRecord, dst: str) -> ObsRelease:
        return cls(op=op, node=node, request_id=record.request_id, lineage=record.lineage,
                   dst=dst)


class ObsApplied(BaseModel):
    type: Literal["applied"] = "applied"
    model_config = _FROZEN
    op: str
    node: str
    records: tuple[tuple[int, Lineage], ...]


class ObsReply(BaseModel):
    type: Literal["reply"] = "reply"
    model_config = _FROZEN
    request_id: int
    digest: str
    lineage: Lineage


class ObsSubmit(BaseModel):
    type: Literal["submit"] = "submit"
    model_config = _FROZEN
    request_id: int


class ObsPromoted(BaseModel):
    type: Literal["promoted"] = "promoted"
    model_config = _FROZEN
    op: str
    node: str
    epoch: int
    start_seq: int


Observation = Annotated[ObsRelease | ObsApplied | ObsReply | ObsSubmit | ObsPromoted,
                        Field(discriminator="type")]
_OBSERVATION: TypeAdapter[Observation] = TypeAdapter(Observation)


def observation_to_json(event: BaseModel) -> str:
    return event.model_dump_json()


def observation_from_json(line: str | bytes) -> BaseModel:
    return _OBSERVATION.validate_json(line)


@dataclass(frozen=True)
class Inconsistency:
    kind: str
    op: str
    seq: int
    detail: str


@dataclass
class ConsistencyReport:
    inconsistencies: list[Inconsistency]
    lost: list[int]
    submitted: int
    replied: int
    committed_outputs: int
    releases: int
    promotions: int

    @property
    def ok(self) -> bool:
        return not self.inconsistencies and not self.lost

    def summary(self) -> str:
        kinds: dict[str, int] = defaultdict(int)
        for item in self.inconsistencies:
            kinds[item.kind] += 1
        return (f"{len(self.inconsistencies)} inconsistencies {dict(kinds)}, {len(self.lost)} lost "
                f"of {self.submitted} requests ({self.replied} replied), "
                f"{self.committed_outputs} committed outputs, {self.releases} releases, "
                f"{self.promotions} promotions")


@dataclass
class ConsistencyChecker:
    """Feed it observations (any order), then ``verify()``."""

    stateful: frozenset[str]
    committed: dict[tuple[str, int], dict[tuple[int, str], str]] = field(
        default_factory=lambda: defaultdict(dict))
    released: dict[tuple[str, int], set[tuple[int, str]]] = field(
        default_factory=lambda: defaultdict(set))
    replies: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    submitted: set[int] = field(default_factory=set)
    seqs_of: dict[tuple[str, int], set[int]] = field(default_factory=lambda: defaultdict(set))
    """(operator, request) -> committed seqs: a request processed twice into surviving state."""
    releases: int = 0
    promotions: int = 0

    def record(self, event: BaseModel) -> None:
        if isinstance(event, ObsRelease):
            self.releases += 1
            entry = event.lineage.get(event.op)
            if entry is not None and event.op in self.stateful:
                self.released[(event.op, entry.seq)].add((event.request_id, entry.digest))
        elif isinstance(event, ObsApplied):
            for rid, lineage in event.records:
                self._commit(lineage, rid, f"state applied by {event.node} ({event.op})")
        elif isinstance(event, ObsReply):
            self.replies[event.request_id].append(event.digest)
            self._commit(event.lineage, event.request_id, "client reply")
        elif isinstance(event, ObsSubmit):
            self.submitted.add(event.request_id)
        elif isinstance(event, ObsPromoted):
            self.promotions += 1

    def record_all(self, events: Iterable[BaseModel]) -> None:
        for event in events:
            self.record(event)

    def _commit(self, lineage: Lineage, rid: int, how: str) -> None:
        for op, entry in lineage.items():
            if op in self.stateful:
                self.committed[(op, entry.seq)].setdefault((rid, entry.digest), how)
                self.seqs_of[(op, rid)].add(entry.seq)

    def verify(self) -> ConsistencyReport:
        found: list[Inconsistency] = []
        for (op, seq), values in sorted(self.committed.items()):
            if len(values) > 1:
                detail = "; ".join(f"request {r} value {d} via {how}"
                                   for (r, d), how in values.items())
                found.append(Inconsistency("conflicting_output", op, seq, detail))
            for value in values:
                if value not in self.released.get((op, seq), ()):
                    found.append(Inconsistency(
                        "never_released", op, seq,
                        f"committed request {value[0]} value {value[1]} was never released"))
        for (op, rid), seqs in sorted(self.seqs_of.items()):
            if len(seqs) > 1:
                found.append(Inconsistency("conflicting_output", op, min(seqs),
                                           f"request {rid} committed at seqs {sorted(seqs)}"))
        for rid, digests in sorted(self.replies.items()):
            if len(set(digests)) > 1:
                found.append(Inconsistency("conflicting_reply", "frontend", rid, str(digests)))
            elif len(digests) > 1:
                found.append(Inconsistency("duplicate_reply", "frontend", rid, str(digests)))
        lost = sorted(self.submitted - set(self.replies))
        return ConsistencyReport(
            inconsistencies=found, lost=lost, submitted=len(self.submitted),
            replied=len(self.replies), committed_outputs=len(self.committed),
            releases=self.releases, promotions=self.promotions)


def read_observations(paths: Iterable[Path]) -> list[BaseModel]:
    """Observations from JSON-lines files; a torn last line (a killed writer) is skipped."""
    out: list[BaseModel] = []
    for path in paths:
        with path.open("rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    break
                out.append(observation_from_json(line))
    return out
