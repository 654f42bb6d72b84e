"""The name index on a live cluster (``hafo.store.name_index``): the first leader writes it;
a workload written without its name key (as a restore writes them), with the index taken
away, gets its key from the next leader after the leader is SIGKILLed; a submit of its name
then finds it, and a submit of a new name creates one workload."""

from __future__ import annotations

import asyncio
import time

import pytest

from hafo.model.cluster import Submission
from hafo.model.spec import WorkloadSpec
from hafo.store import Keys, codec, intents
from hafo.store.name_index import is_indexed

from .conftest import ClusterFactory

pytestmark = pytest.mark.timeout(90)


def spec(name: str) -> WorkloadSpec:
    return WorkloadSpec(name=name, command=("python", "-c", "pass"), gpus=1)


async def test_a_new_leader_indexes_a_workload_without_its_name_key(
        local_cluster: ClusterFactory) -> None:
    cluster = await local_cluster.start(nodes=0, controllers=2)
    store, keys = cluster.store, Keys(cluster.cluster)
    deadline = time.monotonic() + 15
    while not await is_indexed(store, keys):
        assert time.monotonic() < deadline, "the first leader never wrote the name index"
        await asyncio.sleep(0.1)
    old = Submission(id="restored-a1b2c3", spec=spec("restored"), submitted_at=time.time())
    await store.put(keys.workload(old.id), codec.encode_submission(old))
    await store.delete(keys.names_indexed)  # as a restore does
    leader = (await cluster.snapshot()).leader
    assert leader is not None
    cluster.kill_controller(leader)
    deadline = time.monotonic() + 20
    while not await is_indexed(store, keys):
        assert time.monotonic() < deadline, "the next leader never wrote the name index"
        await asyncio.sleep(0.1)
    name_kv = await store.get(keys.name("restored"))
    assert name_kv is not None and name_kv.value.decode() == old.id
    found = await intents.submit(store, keys, spec("restored"))
    assert (found.change, found.submission.id) == ("unchanged", old.id)
    created = await intents.submit(store, keys, spec("fresh"))
    again = await intents.submit(store, keys, spec("fresh"))
    assert created.change == "created"
    assert (again.change, again.submission.id) == ("unchanged", created.submission.id)
