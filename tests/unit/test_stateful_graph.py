"""Graph spec validation and the topology facts NSPB derives from it (HAMS §IV-A)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stateful.errors import InvalidGraphError, UnknownOperatorKindError
from stateful.graph import FRONTEND, GraphSpec, OperatorSpec, graph_from_dict
from stateful.operators import check_kinds
from stateful.services import ol_graph, sp_graph


def op(name: str, stateful: bool = False, kind: str | None = None) -> OperatorSpec:
    return OperatorSpec(name=name, kind=kind or ("lstm" if stateful else "mlp"), stateful=stateful)


def graph(ops: list[OperatorSpec], edges: list[tuple[str, str]]) -> GraphSpec:
    return GraphSpec(name="g", operators=tuple(ops), edges=tuple(edges))


def test_services_validate_and_their_kinds_exist() -> None:
    for spec in (sp_graph(), ol_graph()):
        check_kinds(spec)
        assert spec.topology.stateful


@pytest.mark.parametrize(("ops", "edges", "message"), [
    ([op("a", True)], [(FRONTEND, "a"), ("a", FRONTEND), ("a", "b")], "unknown operator"),
    ([op("a", True), op("b")], [(FRONTEND, "a"), ("a", "b"), ("b", "a"), ("b", FRONTEND)],
     "cycle"),
    ([op("a")], [(FRONTEND, "a"), ("a", FRONTEND)], "no stateful operator"),
    ([op("a", True), op("a")], [(FRONTEND, "a"), ("a", FRONTEND)], "repeats"),
    ([op("a", True), op("b")], [(FRONTEND, "a"), ("a", FRONTEND)], "not reachable"),
    ([op("a", True), op("b")], [(FRONTEND, "a"), ("a", "b"), ("a", FRONTEND)],
     "does not reach"),
    ([op("a", True)], [("a", FRONTEND)], "no entry edge"),
    ([op("a", True)], [(FRONTEND, "a")], "no exit edge"),
    ([op("a", True)], [(FRONTEND, "a"), ("a", "a"), ("a", FRONTEND)], "self-loop"),
    ([op("a", True)], [(FRONTEND, "a"), (FRONTEND, "a"), ("a", FRONTEND)], "duplicate edge"),
])
def test_invalid_graphs_are_rejected(ops: list[OperatorSpec], edges: list[tuple[str, str]],
                                     message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        graph(ops, edges)
    data = {"name": "g", "operators": [o.model_dump() for o in ops], "edges": edges}
    with pytest.raises(InvalidGraphError, match=message):
        graph_from_dict(data)


def test_reserved_and_malformed_operator_names() -> None:
    for name in (FRONTEND, "manager", "Bad", "1x", ""):
        with pytest.raises(ValidationError):
            OperatorSpec(name=name, kind="mlp", stateful=False)


def test_unknown_kind_and_stateful_mismatch() -> None:
    with pytest.raises(UnknownOperatorKindError, match="unknown kind"):
        check_kinds(graph([op("a", True, kind="nope")], [(FRONTEND, "a"), ("a", FRONTEND)]))
    with pytest.raises(UnknownOperatorKindError, match="stateless but"):
        check_kinds(graph([op("a", True, kind="mlp")], [(FRONTEND, "a"), ("a", FRONTEND)]))


def test_extra_fields_and_bad_batch_size_are_rejected() -> None:
    with pytest.raises(ValidationError):
        GraphSpec.model_validate({"name": "g", "operators": [], "edges": [], "colour": 1})
    with pytest.raises(ValidationError):
        sp_graph(batch_size=0)


def test_sp_topology_previous_and_next_stateful_models() -> None:
    topo = sp_graph().topology
    assert topo.stateful == {"sentiment", "stock"}
    assert topo.pfm["stock"] == {"sentiment"}
    assert topo.pfm["sentiment"] == frozenset()
    assert topo.nfm["sentiment"] == {"stock"}
    assert topo.nfm["stock"] == {FRONTEND}
    assert topo.pfm[FRONTEND] == {"stock"}
    assert topo.entries == ("embed", "features")
    assert topo.sinks == ("predict",)
    assert topo.order.index("sentiment") < topo.order.index("stock")


def test_join_inputs_follow_the_request_entries() -> None:
    topo = sp_graph().topology
    both = ("embed", "features")
    assert topo.active_preds("stock", both) == ("features", "sentiment")
    assert topo.active_preds("stock", ("features",)) == ("features",)
    assert topo.active_preds("embed", both) == (FRONTEND,)
    assert topo.active_preds("embed", ("features",)) == ()
    assert topo.expected_sinks(both) == ("predict",)


def test_ol_chain_of_stateful_models() -> None:
    topo = ol_graph().topology
    assert topo.pfm["classifier"] == {"tracker"}
    assert topo.nfm["tracker"] == {"classifier"}
    assert topo.nfm["classifier"] == {FRONTEND}
