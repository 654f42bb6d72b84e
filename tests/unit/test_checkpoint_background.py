"""save_async(snapshot="background"): the call returns before the state is copied, the copy
runs chunk by chunk before the write, ``wait_snapshot`` and ``guard(optimizer)`` hold the
state still until it is taken, and a failed copy commits nothing and is raised once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint import list_checkpoints
from hafo.checkpoint import staging as staging_module
from hafo.checkpoint.blobio import CHUNK
from hafo.checkpoint.staging import SnapshotFailed, Staged, Stager

from .conftest import make_checkpointer as make

pytestmark = pytest.mark.usefixtures("restore_sigusr1")

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")


@pytest.fixture
def held_copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Deferred copies start only once the returned event is set (or after 10 s)."""
    release = threading.Event()
    start = Staged.start

    def held(self: Staged) -> None:
        def later() -> None:
            release.wait(10)
            start(self)

        threading.Thread(target=later, daemon=True).start()

    monkeypatch.setattr(Staged, "start", held)
    yield release
    release.set()


def model_state() -> dict[str, Any]:
    # big enough for several chunks: the writer waits for each chunk's own event
    return {"w": torch.arange(3 * CHUNK // 4, dtype=torch.float32), "a": np.arange(1000.0),
            "t": torch.arange(6.0).reshape(2, 3).T, "step": 7, "empty": torch.zeros(0)}


def test_returns_before_copying_and_the_checkpoint_holds_the_state_of_the_call(
        tmp_path: Path, held_copies: threading.Event) -> None:
    ck = make(tmp_path)
    state = model_state()
    expected = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
    assert ck.save_async(state, step=1, snapshot="background") is True
    assert ck._snapshot is not None and not ck._snapshot.done  # nothing copied yet
    assert list_checkpoints(tmp_path) == []  # the writer waits for the copies
    held_copies.set()
    ck.wait_snapshot()
    state["w"].fill_(-1.0)  # allowed now: the copy is taken
    state["a"][:] = -1.0
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and restored.step == 1
    assert torch.equal(restored.state["w"], expected["w"])
    assert np.array_equal(restored.state["a"], np.arange(1000.0))
    assert torch.equal(restored.state["t"], expected["t"])
    assert restored.state["step"] == 7 and restored.state["empty"].numel() == 0


def test_guard_makes_the_optimizer_step_wait_for_the_copy(
        tmp_path: Path, held_copies: threading.Event) -> None:
    ck = make(tmp_path)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    handle = ck.guard(optimizer)
    before = model.weight.detach().clone()
    model(torch.randn(8, 64)).sum().backward()
    ck.save_async({"model": model.state_dict()}, step=1, snapshot="background")
    threading.Timer(0.3, held_copies.set).start()  # the copy is late: step() must wait
    optimizer.step()
    assert not torch.equal(model.weight.detach(), before)
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None
    assert torch.equal(restored.state["model"]["weight"], before)  # not the stepped weights
    handle.remove()


def test_without_the_guard_a_change_before_the_copy_lands_in_the_checkpoint(
        tmp_path: Path, held_copies: threading.Event) -> None:
    """The contract's other side, shown: the state must not change before wait_snapshot."""
    ck = make(tmp_path)
    state = {"w": torch.zeros(1000)}
    ck.save_async(state, step=1, snapshot="background")
    state["w"].fill_(5.0)
    held_copies.set()
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and float(restored.state["w"][0]) == 5.0


def test_a_failed_copy_commits_nothing_and_the_next_call_raises_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ck = make(tmp_path)
    ck.save({"w": torch.ones(10)}, step=1)
    plan = Stager._plan

    def failing(staged: Staged, buffer: Any, copy: Any, count: int, step: int) -> None:
        def broken(a: int, b: int) -> None:
            raise RuntimeError("the tensor changed shape")

        plan(staged, buffer, broken, count, step)

    monkeypatch.setattr(Stager, "_plan", staticmethod(failing))
    ck.save_async({"w": torch.ones(10)}, step=2, snapshot="background")
    ck.wait_snapshot()  # returns: a training step is not the place for the error
    with pytest.raises(RuntimeError, match="could not be copied: the tensor changed shape"):
        ck.wait()
    assert [ref.step for ref in list_checkpoints(tmp_path)] == [1]
    ck.wait()  # raised once


def test_a_snapshot_of_a_save_now_needs_no_waiting(tmp_path: Path) -> None:
    ck = make(tmp_path)
    ck.wait_snapshot()  # nothing saved yet
    ck.save_async({"w": torch.ones(4)}, step=1)
    ck.wait_snapshot()
    ck.wait()
    assert ck._snapshot is None


def test_snapshot_must_be_now_or_background(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="snapshot must be 'now' or 'background'"):
        make(tmp_path).save_async({"w": torch.ones(1)}, step=1, snapshot="later")  # type: ignore[arg-type]


def test_guard_needs_an_optimizer_with_step_hooks(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="register_step_pre_hook"):
        make(tmp_path).guard(object())


def test_staged_events_are_per_chunk_and_ready_raises_a_failed_copy() -> None:
    source = torch.arange(1000)  # under a chunk
    exact = torch.ones(CHUNK // 4, dtype=torch.float32)  # one chunk exactly
    bigger = torch.ones(2 * CHUNK // 8 + 1, dtype=torch.float64)  # two chunks and 8 bytes
    staged = Stager().stage({"s": source, "e": exact, "g": bigger}, defer=True)
    assert [len(events) for events in staged.events.values()] == [1, 1, 3]
    staged.start()
    staged.wait()
    assert staged.done and torch.equal(staged.state["s"], source)

    broken = Stager().stage({"x": torch.ones(3)}, defer=True)
    broken.copies[0] = (_raise, *broken.copies[0][1:])
    broken.start()
    with pytest.raises(SnapshotFailed, match="boom"):
        broken.wait()
    with pytest.raises(SnapshotFailed):
        ready = broken.ready([broken.state["x"]])
        assert ready is not None
        ready(0, 0)


def _raise(_a: int, _b: int) -> None:
    raise ValueError("boom")


def test_noncontiguous_sources_are_copied_whole(tmp_path: Path) -> None:
    state = {"t": torch.arange(12.0).reshape(3, 4).T, "a": np.arange(12.0).reshape(3, 4).T}
    staged = Stager().stage(state, defer=True)
    staged.start()
    staged.wait()
    assert torch.equal(staged.state["t"], state["t"])
    assert np.array_equal(staged.state["a"], state["a"])
    assert staging_module.CHUNK == CHUNK


def test_save_retires_old_checkpoints_at_once_and_deletes_them_beside_the_caller(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hafo.checkpoint import sdk as sdk_module

    release = threading.Event()
    empty = sdk_module.empty_trash

    def held_empty(root: Path) -> None:
        release.wait(10)
        empty(root)

    monkeypatch.setattr(sdk_module, "empty_trash", held_empty)
    ck = make(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        ck.save({"w": torch.full((1000,), float(step))}, step=step)
    # step 1 left every listing when save returned; its bytes are deleted later
    assert [ref.step for ref in list_checkpoints(tmp_path)] == [3, 2]
    trash = [p.name for p in tmp_path.iterdir() if p.name.startswith(".trash-")]
    assert len(trash) == 1 and "s000000000001" in trash[0]
    restored_before = [ref.step for ref in list_checkpoints(tmp_path)]
    release.set()
    ck.wait()  # waits for the deletion too
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".trash-")]
    assert restored_before == [3, 2]


def test_trash_a_crash_left_behind_is_deleted_by_the_next_save(tmp_path: Path) -> None:
    left = tmp_path / ".trash-ckpt-e000000000001-s000000000001-abcd1234"
    (left / "part").mkdir(parents=True)
    (left / "part" / "data.bin").write_bytes(b"x" * 100)
    ck = make(tmp_path, keep_last=1)
    ck.save({"n": 1}, step=1)
    ck.save({"n": 2}, step=2)
    ck.wait()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".json")) == [
        "ckpt-e000000000001-s000000000002"]
