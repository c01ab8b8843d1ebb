"""The agent's load admission: one slot kept for urgent loads, urgent ones first."""

from __future__ import annotations

import asyncio

import pytest

from agent.load_slots import LoadSlots


async def _hold(slots: LoadSlots, urgent: bool, name: str, log: list[str],
                release: asyncio.Event) -> None:
    async with slots.slot(urgent):
        log.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_rejects_no_slots() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        LoadSlots(0)


def test_routine_loads_leave_one_slot_for_an_urgent_one() -> None:
    async def scenario() -> list[str]:
        slots, log, release = LoadSlots(2), [], asyncio.Event()
        tasks = [asyncio.create_task(_hold(slots, False, f"routine-{i}", log, release))
                 for i in range(3)]
        await _settle()
        assert log == ["routine-0"]  # the second slot stays free
        tasks.append(asyncio.create_task(_hold(slots, True, "urgent", log, release)))
        await _settle()
        assert log == ["routine-0", "urgent"]
        assert slots.running == 2
        release.set()
        await asyncio.gather(*tasks)
        assert slots.running == 0 and slots.waiting == (0, 0)
        return log

    assert asyncio.run(scenario()) == ["routine-0", "urgent", "routine-1", "routine-2"]


def test_a_freed_slot_goes_to_waiting_urgent_loads_first() -> None:
    async def scenario() -> list[str]:
        slots, log = LoadSlots(2), []
        first, rest = asyncio.Event(), asyncio.Event()
        busy = [asyncio.create_task(_hold(slots, False, "routine-a", log, first)),
                asyncio.create_task(_hold(slots, True, "urgent-a", log, rest))]
        await _settle()
        queued = [asyncio.create_task(_hold(slots, False, "routine-b", log, rest)),
                  asyncio.create_task(_hold(slots, True, "urgent-b", log, rest))]
        await _settle()
        assert slots.waiting == (1, 1)
        first.set()  # routine-a ends: its slot goes to urgent-b although routine-b came first
        await _settle()
        assert log[-1] == "urgent-b"
        rest.set()
        await asyncio.gather(*busy, *queued)
        return log

    assert asyncio.run(scenario()) == ["routine-a", "urgent-a", "urgent-b", "routine-b"]


def test_single_slot_is_shared_in_priority_order() -> None:
    async def scenario() -> list[str]:
        slots, log, release = LoadSlots(1), [], asyncio.Event()
        tasks = [asyncio.create_task(_hold(slots, False, "routine-0", log, release))]
        await _settle()
        tasks += [asyncio.create_task(_hold(slots, False, "routine-1", log, release)),
                  asyncio.create_task(_hold(slots, True, "urgent", log, release))]
        await _settle()
        assert log == ["routine-0"]
        release.set()
        await asyncio.gather(*tasks)
        return log

    assert asyncio.run(scenario()) == ["routine-0", "urgent", "routine-1"]


def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def scenario() -> None:
        slots, log, release = LoadSlots(1), [], asyncio.Event()
        holder = asyncio.create_task(_hold(slots, False, "holder", log, release))
        await _settle()
        cancelled = asyncio.create_task(_hold(slots, True, "cancelled", log, release))
        waiting = asyncio.create_task(_hold(slots, False, "next", log, release))
        await _settle()
        cancelled.cancel()
        await _settle()
        assert slots.waiting == (0, 1)
        release.set()
        await asyncio.gather(holder, waiting)
        assert log == ["holder", "next"]
        assert slots.running == 0

    asyncio.run(scenario())


def test_a_routine_cap_below_the_slots_lets_urgent_loads_use_the_rest() -> None:
    async def scenario() -> list[str]:
        slots, log, release = LoadSlots(6, routine_slots=2), [], asyncio.Event()
        tasks = [asyncio.create_task(_hold(slots, False, f"routine-{i}", log, release))
                 for i in range(3)]
        await _settle()
        assert log == ["routine-0", "routine-1"]  # two routine at a time, the third waits
        tasks += [asyncio.create_task(_hold(slots, True, f"urgent-{i}", log, release))
                  for i in range(5)]
        await _settle()
        # Four urgent loads fill the six slots; the fifth urgent and third routine one wait.
        assert log[2:] == [f"urgent-{i}" for i in range(4)]
        assert slots.running == 6 and slots.waiting == (1, 1)
        release.set()
        await asyncio.gather(*tasks)
        return log

    log = asyncio.run(scenario())
    assert sorted(log) == sorted([f"routine-{i}" for i in range(3)] +
                                 [f"urgent-{i}" for i in range(5)])
    # The waiting urgent load went before the waiting routine one.
    assert log.index("urgent-4") < log.index("routine-2")


def test_rejects_a_routine_cap_outside_the_slots() -> None:
    with pytest.raises(ValueError, match="routine_slots"):
        LoadSlots(3, routine_slots=4)


# --- the runtime's loading niceness (urgent loads outrank inference, routine ones do not) ----

def test_only_urgent_loads_outrank_inference() -> None:
    from model_repo.worker_priority import LOADING_NICE_STEP, SERVING_NICE_STEP, loading_niceness

    def request(priority: str | None) -> dict:
        parameters = {} if priority is None else {
            "load_priority": {"string_value": priority}}
        return {"op": "spawn", "config": {"parameters": parameters}}

    assert loading_niceness(request("urgent"), 0) == -LOADING_NICE_STEP
    assert loading_niceness(request(None), 0) == -LOADING_NICE_STEP  # configs from before
    assert loading_niceness({"op": "spawn", "weights": "w"}, 0) == -LOADING_NICE_STEP
    assert loading_niceness(request("routine"), 0) == SERVING_NICE_STEP
    assert loading_niceness(request("routine"), 17) == 19
    assert loading_niceness(request("urgent"), -18) == -20


def test_the_agent_writes_the_loads_priority_into_the_config() -> None:
    from model_repo.artifacts import render_config
    from understudy.wire.artifacts import NetworkSpec

    spec = NetworkSpec(width=8, hidden_layers=1, num_classes=4, image_side=16, seed=1)
    urgent = render_config("m", spec, "w.pt")
    routine = render_config("m", spec, "w.pt", urgent=False)
    assert 'key: "load_priority" value: { string_value: "urgent" }' in urgent
    assert 'key: "load_priority" value: { string_value: "routine" }' in routine
