"""Apps that share a model share one batch queue (``--model-queue APP=QUEUE``).

One scheduler then sees the requests of every app of the queue, each with its own app's
execution times and objective (Orloj's per-model queue, §3.2): short and long requests are
told apart before they run, and batched together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest
from pydantic import ValidationError

from gateway.batching import BatchPolicy, BatchSettings
from gateway.calibration import MIN_APP_SAMPLES, profile_of
from gateway.config import GatewayConfig
from scheduling.orloj import Orloj
from scheduling.types import BatchLaw
from tests.unit.scenario import run
from tests.unit.test_gateway_batching import (
    SCENARIO_LIMIT_S,
    FakeModel,
    make_request,
    until,
    value_of,
)

SHORT, LONG = "short", "long"


def exec_of(value: float) -> float:
    """Values below 100 come from the short app (2 ms), the others from the long one (12 ms)."""
    return 0.002 if value < 100 else 0.012


def shared(name: str = "orloj", slo_ms: dict[str, float] | None = None,
           place: dict[str, Hashable] | None = None) -> BatchPolicy:
    slos = slo_ms or {SHORT: 300.0, LONG: 300.0}
    where = place or {}
    return BatchPolicy("digits-queue", BatchSettings(name, 8, "exec_us", 6), slos.get,
                       place=lambda app_id: where.get(app_id))


async def warm_up_both(p: BatchPolicy, model: FakeModel) -> None:
    for i in range(3):
        await p.dispatch(make_request(float(i), app_id=SHORT), model.send)
        await p.dispatch(make_request(100.0 + i, app_id=LONG), model.send)
    await until(lambda: p.warm)


def test_apps_of_one_queue_are_batched_together_each_with_its_own_execution_times() -> None:
    async def scenario() -> None:
        model = FakeModel(exec_s=exec_of, report=True)
        p = shared()
        await warm_up_both(p, model)
        assert isinstance(p.scheduler, Orloj)
        apps = p.scheduler.profile.apps  # the scheduler plans with each app's own times
        assert apps[SHORT].quantile(0.5) == pytest.approx(0.002, rel=0.1)
        assert apps[LONG].quantile(0.5) == pytest.approx(0.012, rel=0.1)
        model.batches.clear()
        values = [float(v) for v in range(10, 22)] + [float(v) for v in range(110, 122)]
        answers = await asyncio.gather(*(
            p.dispatch(make_request(v, app_id=SHORT if v < 100 else LONG), model.send)
            for v in values))
        assert [value_of(a) for a in answers] == pytest.approx(values)  # each its own rows
        assert sum(model.batches) == len(values) and max(model.batches) > 1
        assert model.most_busy == 1  # one batch at a time for the whole queue
        # each app's window learns its own rows' times: every short one below every long one
        # (both are divided by the measured law's scale, whose slope a busy machine moves)
        assert set(p.solo) == {SHORT, LONG} and max(p.solo[SHORT]) < min(p.solo[LONG])

    run(scenario, SCENARIO_LIMIT_S)


def test_a_batch_of_apps_served_in_different_places_goes_in_one_request_per_place() -> None:
    async def scenario() -> None:
        model = FakeModel()
        p = shared("triton", place={SHORT: ("s1", "m"), LONG: ("s2", "m")})
        await warm_up_both(p, model)
        model.hold = asyncio.Event()  # the next requests queue up behind this one
        first = asyncio.create_task(p.dispatch(make_request(1.0, app_id=SHORT), model.send))
        await until(lambda: model.busy == 1)
        model.batches.clear()
        model.sent_as.clear()
        rest = [asyncio.create_task(p.dispatch(make_request(v, app_id=app), model.send))
                for v, app in ((2.0, SHORT), (102.0, LONG), (3.0, SHORT), (103.0, LONG))]
        await asyncio.sleep(0.01)
        model.hold.set()
        assert value_of(await first) == 1.0
        assert [value_of(await t) for t in rest] == [2.0, 102.0, 3.0, 103.0]
        # one batch of four, sent as two Triton requests: each app's to where it is served
        assert sorted(zip(model.sent_as, model.batches, strict=True)) == [(LONG, 2), (SHORT, 2)]

    run(scenario, SCENARIO_LIMIT_S)


def test_the_baselines_plan_for_the_tightest_objective_of_the_queue() -> None:
    async def scenario() -> None:
        model = FakeModel(exec_s=exec_of, report=True)
        p = shared("nexus", slo_ms={SHORT: 40.0, LONG: 300.0})
        await warm_up_both(p, model)
        assert p.slo_s == pytest.approx(0.040)

    run(scenario, SCENARIO_LIMIT_S)


def test_a_queue_profile_gives_an_app_with_too_few_times_the_mixture() -> None:
    law = BatchLaw(0.1)
    profile = profile_of({"a": [0.001, 0.002, 0.003], "b": [0.5]}, law, arrivals={"a": 9})
    assert set(profile.apps) == {"a"} and MIN_APP_SAMPLES == 2
    assert profile.solo("b") is profile.mix  # unknown to the profile: the model's mixture
    pooled = profile_of({"a": [0.001], "b": [0.003]}, law, pooled="q")
    assert set(pooled.apps) == {"q"} and pooled.mix.quantile(1.0) == pytest.approx(0.003)
    with pytest.raises(ValueError):
        profile_of({}, law)


def test_the_config_shares_a_queue_only_between_apps_of_one_scheduler() -> None:
    from gateway.service import Gateway

    config = GatewayConfig(controller_url="http://127.0.0.1:1", run_dir="/nonexistent/gw",
                           scheduler={"a": "orloj", "b": "orloj", "c": "orloj"},
                           model_queue={"a": "digits", "b": "digits"})
    assert config.shared_queues() == {"digits": ["a", "b"]}
    gateway = Gateway(config)
    same = gateway._policy("a")
    assert same is gateway._policy("b") and isinstance(same, BatchPolicy)
    assert same.queue_id == "digits" and gateway._policy("c") is not same
    for bad in ({"scheduler": {"a": "orloj", "b": "nexus"}},  # two schedulers, one queue
                {"scheduler": {"a": "orloj"}},  # b has none
                {"scheduler": {"a": "orloj", "b": "orloj"}, "model_queue": {"a": "x__y"}},
                {"scheduler": {"a": "orloj", "b": "orloj"}, "model_queue": {"a__": "q"}}):
        queues = bad.pop("model_queue", {"a": "q", "b": "q"})
        with pytest.raises(ValidationError):
            GatewayConfig(controller_url="http://127.0.0.1:1", model_queue=queues, **bad)
