"""Registration refuses an app no artifact store can serve, unless its artifacts are provided.

An app of a family the controller's store does not hold used to be recorded (201) and then
never served: its primary's load failed on every server, forever. The orchestrator on the fakes,
and the catalog's listing of a store on disk.
"""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

import pytest

import controller.artifacts as artifacts_module
from controller.artifacts import ArtifactCatalog
from controller.errors import InvalidBatchError, InvalidRequestError
from controller.records import AppSpec
from tests.unit.controller_harness import LARGE, MEDIUM, SMALL, Controller, new_cluster
from tests.unit.scenario import run
from understudy.wire.artifacts import Manifest


def cluster(held: Set[str] | None) -> Controller:
    ctl = new_cluster()

    async def held_variants() -> Set[str] | None:
        return held

    ctl.orchestrator.held_variants = held_variants
    return ctl


def test_an_app_whose_variant_the_store_lacks_is_refused_with_the_reason() -> None:
    ctl = cluster({SMALL, MEDIUM})
    with pytest.raises(InvalidRequestError) as refused:
        run(lambda: ctl.orchestrator.register(AppSpec(app_id="a", family="f")))
    message = str(refused.value)
    assert f"does not hold {LARGE}" in message and f"{SMALL}, {MEDIUM}" in message
    assert refused.value.status == 422 and ctl.store.all_apps() == {}


def test_a_family_the_store_lacks_entirely_is_named() -> None:
    ctl = cluster(set())
    with pytest.raises(InvalidRequestError, match="holds no variant of family 'f'"):
        run(lambda: ctl.orchestrator.register(AppSpec(app_id="a", family="f",
                                                      variant=SMALL)))


@pytest.mark.parametrize("held, spec", [
    ({SMALL}, AppSpec(app_id="a", family="f", variant=SMALL)),
    ({LARGE}, AppSpec(app_id="a", family="f")),
    (set(), AppSpec(app_id="a", family="f", artifacts_provided=True)),
    (None, AppSpec(app_id="a", family="f")),  # no store: the agents have their own source
])
def test_an_app_the_store_can_serve_or_whose_artifacts_are_provided_registers(
        held: Set[str] | None, spec: AppSpec) -> None:
    ctl = cluster(held)
    record = run(lambda: ctl.orchestrator.register(spec))
    assert record.app_id == "a" and set(ctl.store.all_apps()) == {"a"}


def test_a_batch_names_each_app_the_store_cannot_serve_and_records_none() -> None:
    ctl = cluster({SMALL})
    specs = [AppSpec(app_id="a", family="f", variant=SMALL),
             AppSpec(app_id="b", family="f"),
             AppSpec(app_id="c", family="f", artifacts_provided=True)]
    with pytest.raises(InvalidBatchError) as refused:
        run(lambda: ctl.orchestrator.register_many(specs))
    assert [e["field"] for e in refused.value.errors] == ["body.apps.1"]
    assert ctl.store.all_apps() == {}


def _variant(store: Path, family: str, variant: str) -> None:
    directory = store / family / variant
    directory.mkdir(parents=True)
    (directory / "weights.pt").write_bytes(b"w")
    (directory / "manifest.json").write_text(Manifest(
        family=family, variant=variant, profiled_size_mb=1.0, scale=0.1, weights_mb=0.1,
        weights_sha256="0" * 64, spec={"width": 8}, max_batch_size=1).model_dump_json())


def test_the_catalog_lists_the_variants_of_its_store(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _variant(tmp_path, "mobilenet_v3", "mobilenet_v3_small")
    (tmp_path / "mobilenet_v3" / "half_built").mkdir()  # no manifest: not held
    catalog = ArtifactCatalog(tmp_path)
    assert run(catalog.variants) == {"mobilenet_v3_small"}
    _variant(tmp_path, "mobilenet_v3", "mobilenet_v3_large")
    assert run(catalog.variants) == {"mobilenet_v3_small"}  # listed a moment ago
    monkeypatch.setattr(artifacts_module, "LISTING_MAX_AGE_S", 0.0)
    assert run(catalog.variants) == {"mobilenet_v3_small", "mobilenet_v3_large"}
    assert run(ArtifactCatalog(None).variants) is None
