"""Service-graph specs (validated, pydantic) and the topology facts the protocol needs.

A graph is a DAG of operators (HAMS §III-A). The frontend is the reserved vertex ``frontend``:
edges ``frontend -> op`` name the entry operators a client request may target, edges
``op -> frontend`` the operators whose outputs form the reply.

Join semantics (HAMS §III-A lets the developer choose; we fix "combine"): an operator processes a
client request once it holds one output for that request from each *active* predecessor — the
predecessors reachable from the request's entries. So every operator processes each client
request at most once, and a request's lineage is a map ``operator -> (epoch, seq, digest)``
(Algorithm 1's per-edge ``(pred_seq -> my_seq)`` mapping, flattened: each operator appears once).
Different requests from several predecessors interleave non-deterministically (HAMS's S1).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stateful.errors import InvalidGraphError

FRONTEND = "frontend"
"""The reserved vertex for client requests in and replies out."""

MANAGER = "manager"
"""Node id of the recovery coordinator."""

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_RESERVED = frozenset({FRONTEND, MANAGER})

ParamValue = int | float | str | bool


class OperatorSpec(BaseModel):
    """One vertex: a model ``kind`` from the operator registry and its constructor params."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: str
    stateful: bool
    params: dict[str, ParamValue] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> OperatorSpec:
        if not _NAME.match(self.name) or self.name in _RESERVED:
            raise InvalidGraphError(
                f"operator name {self.name!r} must match {_NAME.pattern} and not be reserved")
        if not self.kind:
            raise InvalidGraphError(f"operator {self.name!r} has an empty kind")
        return self


class GraphSpec(BaseModel):
    """A service graph: operators, edges (``frontend`` at both ends) and the batch size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    operators: tuple[OperatorSpec, ...]
    edges: tuple[tuple[str, str], ...]
    batch_size: Annotated[int, Field(ge=1, le=4096)] = 16
    seed: int = 0
    """Seeds every operator's initial parameters, so primary, backup and standby agree."""

    @model_validator(mode="after")
    def _validate_graph(self) -> GraphSpec:
        _validate(self)
        return self

    @cached_property
    def topology(self) -> Topology:
        """Derived adjacency, PFM/NFM sets and reachability (computed once per spec)."""
        return Topology.build(self)

    def operator(self, name: str) -> OperatorSpec:
        """The operator called ``name``; ``InvalidGraphError`` when there is none."""
        for op in self.operators:
            if op.name == name:
                return op
        raise InvalidGraphError(f"graph {self.name!r} has no operator {name!r}")


def _validate(spec: GraphSpec) -> None:
    if not spec.name:
        raise InvalidGraphError("graph name must not be empty")
    names = [op.name for op in spec.operators]
    _validate_edges(spec, names)
    if not any(op.stateful for op in spec.operators):
        raise InvalidGraphError(
            f"graph {spec.name!r} has no stateful operator; serve it from Triton instead")
    _topological_order(names, [e for e in spec.edges if FRONTEND not in e])
    succ = _adjacency(spec.edges)
    pred = _adjacency((d, s) for s, d in spec.edges)
    from_front = _reach(FRONTEND, succ)
    to_front = _reach(FRONTEND, pred)
    for name in names:
        if name not in from_front:
            raise InvalidGraphError(f"operator {name!r} is not reachable from the frontend")
        if name not in to_front:
            raise InvalidGraphError(f"operator {name!r} does not reach the frontend")


def _validate_edges(spec: GraphSpec, names: list[str]) -> None:
    if not names:
        raise InvalidGraphError(f"graph {spec.name!r} has no operators")
    if len(set(names)) != len(names):
        raise InvalidGraphError(f"graph {spec.name!r} repeats an operator name: {names}")
    known = set(names) | {FRONTEND}
    seen: set[tuple[str, str]] = set()
    for src, dst in spec.edges:
        for end in (src, dst):
            if end not in known:
                raise InvalidGraphError(f"edge {src}->{dst} names unknown operator {end!r}")
        if src == dst:
            raise InvalidGraphError(f"self-loop on {src!r}")
        if (src, dst) in seen:
            raise InvalidGraphError(f"duplicate edge {src}->{dst}")
        seen.add((src, dst))
    if not any(src == FRONTEND for src, _ in spec.edges):
        raise InvalidGraphError("no entry edge frontend->op")
    if not any(dst == FRONTEND for _, dst in spec.edges):
        raise InvalidGraphError("no exit edge op->frontend")


def _adjacency(edges: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for src, dst in edges:
        out.setdefault(src, []).append(dst)
    return out


def _reach(start: str, adj: Mapping[str, list[str]]) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in adj.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _topological_order(names: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """Kahn's algorithm, ties broken by name for a deterministic order; rejects cycles."""
    indegree = {n: 0 for n in names}
    succ = _adjacency(edges)
    for _, dst in edges:
        indegree[dst] += 1
    ready = sorted(n for n, d in indegree.items() if d == 0)
    order: list[str] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for nxt in succ.get(node, ()):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
                ready.sort()
    if len(order) != len(names):
        cyclic = sorted(n for n in names if n not in order)
        raise InvalidGraphError(f"the graph has a cycle through {cyclic}")
    return order


@dataclass(frozen=True)
class Topology:
    """Everything the cores derive from the spec (HAMS §IV-A vocabulary)."""

    order: tuple[str, ...]
    stateful: frozenset[str]
    preds: Mapping[str, tuple[str, ...]]
    succs: Mapping[str, tuple[str, ...]]
    entries: tuple[str, ...]
    sinks: tuple[str, ...]
    pfm: Mapping[str, frozenset[str]]
    """Previous stateful models of each operator and of ``frontend`` (nearest upstream)."""
    nfm: Mapping[str, frozenset[str]]
    """Next stateful models of each stateful operator; ``frontend`` when a stateless path ends
    at the frontend (the frontend is "a special model whose durable action is sending replies",
    §IV-D)."""
    downstream: Mapping[str, frozenset[str]]
    _reach: dict[frozenset[str], frozenset[str]] = field(
        default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, spec: GraphSpec) -> Topology:
        names = [op.name for op in spec.operators]
        inner = [e for e in spec.edges if FRONTEND not in e]
        order = tuple(_topological_order(names, inner))
        stateful = frozenset(op.name for op in spec.operators if op.stateful)
        succ = _adjacency(spec.edges)
        pred = _adjacency((d, s) for s, d in spec.edges)
        preds = {n: tuple(sorted(pred.get(n, ()))) for n in names}
        succs = {n: tuple(sorted(succ.get(n, ()))) for n in names}
        pfm = {n: _nearest(n, pred, stateful) - {FRONTEND} for n in [*names, FRONTEND]}
        nfm = {n: _nearest(n, succ, stateful) for n in stateful}
        inner_succ = _adjacency(inner)
        downstream = {n: frozenset(_reach(n, inner_succ)) for n in names}
        return cls(order=order, stateful=stateful, preds=preds, succs=succs,
                   entries=tuple(sorted(succ.get(FRONTEND, ()))),
                   sinks=tuple(sorted(pred.get(FRONTEND, ()))),
                   pfm=pfm, nfm=nfm, downstream=downstream)

    def active_preds(self, op: str, entries: Iterable[str]) -> tuple[str, ...]:
        """Predecessors of ``op`` that a request entering at ``entries`` reaches (join set)."""
        entry_set = frozenset(entries)
        reach = self.reach_from(entry_set)
        return tuple(p for p in self.preds[op]
                     if p in reach and (p != FRONTEND or op in entry_set))

    def reach_from(self, entries: frozenset[str]) -> frozenset[str]:
        """Operators (and ``frontend`` as the reply) a request entering at ``entries`` visits."""
        hit = self._reach.get(entries)
        if hit is None:
            out: set[str] = {FRONTEND}
            for entry in entries:
                out.add(entry)
                out |= self.downstream[entry]
            hit = self._reach[entries] = frozenset(out)
        return hit

    def expected_sinks(self, entries: Iterable[str]) -> tuple[str, ...]:
        """Sinks whose outputs make up the reply of a request entering at ``entries``."""
        reach = self.reach_from(frozenset(entries))
        return tuple(s for s in self.sinks if s in reach)


def _nearest(start: str, adj: Mapping[str, list[str]], stateful: frozenset[str]) -> frozenset[str]:
    """Nearest stateful vertices along ``adj`` (or ``frontend``), not crossing stateful ones."""
    found: set[str] = set()
    seen: set[str] = set()
    stack = list(adj.get(start, ()))
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node in stateful or node == FRONTEND:
            found.add(node)
        else:
            stack.extend(adj.get(node, ()))
    return frozenset(found)


def graph_from_dict(data: Mapping[str, Any]) -> GraphSpec:
    """Validate a plain mapping (e.g. parsed JSON) into a ``GraphSpec``."""
    from pydantic import ValidationError

    try:
        return GraphSpec.model_validate(data)
    except ValidationError as exc:
        raise InvalidGraphError(str(exc)) from exc
