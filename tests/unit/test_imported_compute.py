"""An imported variant's compute is its latency beyond the serving path's, and a critical app of
an imported family gets a warm backup on a test bed that has room for one.

``_TINY`` holds figures of the kind an import gives the integration test's family (two models
that compute next to nothing: ``x @ A @ B`` through 6 and 4096 wide layers): their p50 is the
serving path (HTTP, Triton's dynamic batcher, the runtime) plus jitter, here with the 6-wide
model 0.2 ms above the 4096-wide one. Read with a fixed 1 ms overhead, the small model "needs"
2.2 times the large one's compute; the 2-server test bed sizes each server to the large
primary's demand, so the small backup does not fit the free server and the large one not the
warm budget: the critical app stays uncovered. Servers are now sized for every variant an app
may run, which covers it whatever the measurement's jitter.
"""

from __future__ import annotations

from datetime import date

import pytest

from model_repo.imported import VariantResult, compute_ms, family_document
from model_repo.profiles import FamilyDocument, Measurement, family_from_document
from policies.warm_ilp import plan_warm_backups
from sim.generator import generate_cluster
from understudy.wire.artifacts import Manifest, TensorSpec

# variant -> (batch-1 p50 ms, resident MB, artifact MB).
_TINY = {"tiny_small": (1.3627, 4.3, 0.000447), "tiny_large": (1.1617, 4.92, 0.196774)}
_PROBE_P90_MS = 1.45
"""What the probe (a model computing nothing, served the same way) takes 9 requests in 10."""


def _manifest(variant: str, weights_mb: float) -> Manifest:
    return Manifest(family="tiny", variant=variant, profiled_size_mb=weights_mb, scale=1.0,
                    weights_mb=weights_mb, weights_sha256="0" * 64, max_batch_size=8,
                    format="onnx", weights_file="model.onnx",
                    inputs=(TensorSpec(name="image", dims=(6,)),),
                    outputs=(TensorSpec(name="logits", dims=(6,)),))


def _measurement(p50_ms: float, resident_mb: float, weights_mb: float,
                 overhead_ms: float | None) -> Measurement:
    return Measurement(host="h", server_type="testbed", artifact_scale=1.0,
                       weights_mb=weights_mb, repeats=2, load_s=0.05, load_s_runs=[0.05],
                       unload_s=0.01, latency_p50_ms=p50_ms, latency_p99_ms=3 * p50_ms,
                       latency_requests=10, resident_mb=resident_mb,
                       measured_on=date.today().isoformat(), overhead_ms=overhead_ms)


def _family(overhead_ms: float | None):  # noqa: ANN202 - a policies Family
    results = [VariantResult(_manifest(name, weights), _measurement(p50, resident, weights,
                                                                     overhead_ms), top1=1.0)
               for name, (p50, resident, weights) in _TINY.items()]
    doc = family_document("tiny", results, "family.yaml")
    return family_from_document(FamilyDocument.model_validate(doc))


def test_compute_is_the_latency_beyond_the_measured_serving_path() -> None:
    assert compute_ms(_measurement(11.45, 9.0, 1.0, overhead_ms=1.45)) == pytest.approx(10.0)
    # Within the serving path's own latency: no compute, never a negative one.
    assert compute_ms(_measurement(1.3627, 4.3, 0.1, overhead_ms=1.45)) == 0.0
    # A profile measured before the probe existed keeps the packaged profiles' 1 ms.
    assert compute_ms(_measurement(1.3627, 4.3, 0.1, overhead_ms=None)) == pytest.approx(0.3627)


def test_variants_that_compute_nothing_measurable_get_no_compute() -> None:
    family = _family(_PROBE_P90_MS)
    assert [v.compute_per_rps for v in family.variants] == [0.0, 0.0]
    assert family.most_accurate.name == "tiny_large"  # the larger of two equally accurate


def _plan_for_one_critical_app(overhead_ms: float | None):  # noqa: ANN202 - a WarmPlan
    family = _family(overhead_ms)
    # The integration test's bed: 2 servers in 2 sites, one critical app, 50 % headroom.
    cluster = generate_cluster({"tiny": family}, servers=2, sites=2, apps=1, headroom=0.5,
                               critical_fraction=1.0, seed=0, rate_rps=(1.0, 5.0))
    return cluster, plan_warm_backups(cluster)


def test_the_critical_app_of_an_imported_family_gets_a_warm_backup() -> None:
    cluster, plan = _plan_for_one_critical_app(_PROBE_P90_MS)
    (app,) = cluster.apps
    (primary,) = cluster.placements
    assert primary.variant == "tiny_large"
    assert not plan.uncovered
    (backup,) = plan.assignments
    assert backup.app_id == app.app_id and backup.server_id != primary.server_id
    assert backup.variant == "tiny_small"  # the large one would take the whole free server


def test_with_jitter_read_as_compute_the_app_is_still_covered() -> None:
    """Read with the fixed overhead, jitter makes the smaller model the costlier in compute:
    the generator sizes servers for every variant an app may run, so its backup still fits
    (sized to the primary alone, the critical app stayed uncovered)."""
    family = _family(None)
    small, large = family.variants
    assert small.compute_per_rps > 2 * large.compute_per_rps
    cluster, plan = _plan_for_one_critical_app(None)
    (app,) = cluster.apps
    assert all(server.capacity["compute"] >= small.demand(app.max_rate_rps)["compute"]
               for server in cluster.servers)
    assert not plan.uncovered and [b.variant for b in plan.assignments] == ["tiny_small"]


def test_an_import_whose_probe_jittered_per_variant_still_gets_a_backup() -> None:
    """The figures of a CI run that failed: each variant's probe measured apart, the small
    model's p50 0.11 ms above its probe, the large one's below its own (compute 0)."""
    results = [VariantResult(_manifest("tiny_small", 0.000447),
                             _measurement(1.5715, 4.79, 0.000447, overhead_ms=1.4572), top1=1.0),
               VariantResult(_manifest("tiny_large", 0.7866),
                             _measurement(1.3392, 7.55, 0.7866, overhead_ms=1.6052), top1=1.0)]
    family = family_from_document(FamilyDocument.model_validate(
        family_document("tiny", results, "family.yaml")))
    assert family.most_accurate.compute_per_rps == 0.0
    cluster = generate_cluster({"tiny": family}, servers=2, sites=2, apps=1, headroom=0.5,
                               critical_fraction=1.0, seed=0, rate_rps=(1.0, 5.0))
    plan = plan_warm_backups(cluster)
    assert not plan.uncovered and [b.variant for b in plan.assignments] == ["tiny_small"]
