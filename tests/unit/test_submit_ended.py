"""A submit that changes the spec of a workload that ended says so: the spec is stored, the
workload does not start again (no move is asked), on the in-memory store."""

from __future__ import annotations

import pytest

from hafo.model.cluster import Assignment, Phase
from hafo.model.spec import WorkloadSpec
from hafo.store import codec, intents
from hafo.store.keys import Keys
from hafo.store.memory import MemoryStore

KEYS = Keys("unit")


def spec(steps: int) -> WorkloadSpec:
    return WorkloadSpec(name="train", command=("python", "train.py", str(steps)), gpus=1)


@pytest.mark.parametrize("phase", ["completed", "failed"])
async def test_a_changed_spec_of_an_ended_workload_is_stored_and_not_started(
        phase: Phase) -> None:
    store = MemoryStore()
    wid = (await intents.submit(store, KEYS, spec(1))).submission.id
    ended = Assignment(workload=wid, phase=phase, node=None, reason="exited")
    await store.put(KEYS.assignment(wid), codec.encode(ended.to_dict()))
    result = await intents.submit(store, KEYS, spec(2))
    assert result.change == "updated"
    assert f"the workload {phase} and does not start again" in result.how
    assert await store.get(KEYS.move(wid)) is None
    stored = await store.get(KEYS.workload(wid))
    assert stored is not None
    assert codec.decode_submission(stored.value).spec == spec(2)


async def test_a_changed_spec_of_a_pending_workload_applies_to_its_next_start() -> None:
    store = MemoryStore()
    wid = (await intents.submit(store, KEYS, spec(1))).submission.id
    result = await intents.submit(store, KEYS, spec(2))
    assert result.how == "the new spec applies to its next start"
    assert await store.get(KEYS.move(wid)) is None
