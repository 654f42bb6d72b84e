"""save_async: staging buffers reused from one save to the next, one write in flight, and
``if_busy="skip"``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint import list_checkpoints
from hafo.checkpoint import sdk as sdk_module
from hafo.checkpoint.codec import stage
from hafo.checkpoint.format import write_checkpoint
from hafo.checkpoint.staging import Stager

from .conftest import make_checkpointer as make

pytestmark = pytest.mark.usefixtures("restore_sigusr1")

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")


def model_state(scale: float = 1.0) -> dict[str, Any]:
    return {"w": torch.full((256, 256), scale), "a": np.full(1000, scale), "step": int(scale),
            "t": torch.arange(6.0).reshape(2, 3).T * scale}


def test_staging_buffers_are_reused_for_the_same_layout(tmp_path: Path) -> None:
    ck = make(tmp_path)
    state = model_state()
    ck.save_async(state, step=1)
    first = ck._stager.buffers
    assert set(first) == {("w",), ("a",), ("t",)}
    assert first[("w",)] is not state["w"]  # a private copy
    state["w"].fill_(2.0)
    state["a"][:] = 2.0
    ck.save(state, step=2)  # a plain save in between writes from the state, keeps the buffers
    ck.save_async(state, step=3)
    second = ck._stager.buffers
    assert all(second[key] is first[key] for key in first)  # same buffer objects
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and restored.step == 3
    assert float(restored.state["w"][0, 0]) == 2.0 and float(restored.state["a"][0]) == 2.0
    assert torch.equal(restored.state["t"], state["t"])


def test_a_changed_leaf_gets_a_new_buffer_and_the_rest_are_kept(tmp_path: Path) -> None:
    stager = Stager()
    state = model_state()
    stager.stage(state)
    before = stager.buffers
    state["w"] = torch.zeros(128, 256)  # another shape
    state["a"] = state["a"].astype(np.float32)  # another dtype
    staged = stager.stage(state)
    after = stager.buffers
    assert after[("t",)] is before[("t",)]
    assert after[("w",)] is not before[("w",)] and after[("w",)].shape == (128, 256)
    assert after[("a",)] is not before[("a",)] and after[("a",)].dtype == np.float32
    assert staged.state["w"] is after[("w",)] and staged.ready([]) is None
    del state["t"]
    stager.stage(state)
    assert ("t",) not in stager.buffers  # dropped with the leaf


def test_stage_returns_a_private_copy(tmp_path: Path) -> None:
    state = {"w": torch.ones(3), "a": np.ones(2), "ba": bytearray(b"ab"), "n": np.int64(3)}
    staged = stage(state)
    state["w"].add_(1)
    state["a"] += 1
    state["ba"][0] = 0
    assert torch.equal(staged["w"], torch.ones(3)) and np.array_equal(staged["a"], np.ones(2))
    assert staged["ba"] == b"ab" and staged["n"] == 3 and type(staged["n"]) is int


class BlockedWriter:
    """Stands in for write_checkpoint until released, to keep a background write busy."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.real = write_checkpoint

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.started.set()
        assert self.release.wait(30)
        return self.real(*args, **kwargs)


def test_if_busy_skip_returns_false_without_staging(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    writer = BlockedWriter()
    monkeypatch.setattr(sdk_module, "write_checkpoint", writer)
    ck = make(tmp_path)
    state = model_state()
    try:
        assert ck.save_async(state, step=1, if_busy="skip") is True  # idle: starts
        assert writer.started.wait(10)
        staged_w = ck._stager.buffers[("w",)]
        state["w"].fill_(9.0)
        assert ck.save_async(state, step=2, if_busy="skip") is False  # busy: at once
        assert float(staged_w[0, 0]) == 1.0  # step 1's staged copy was left alone
    finally:
        writer.release.set()
    ck.wait()
    assert [r.step for r in list_checkpoints(tmp_path)] == [1]
    assert ck.save_async(state, step=3, if_busy="skip") is True  # idle again
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and restored.step == 3 and float(restored.state["w"][0, 0]) == 9


def test_default_waits_for_the_write_in_flight(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    writer = BlockedWriter()
    monkeypatch.setattr(sdk_module, "write_checkpoint", writer)
    ck = make(tmp_path, keep_last=5)
    ck.save_async(model_state(1.0), step=1)
    assert writer.started.wait(10)
    second = threading.Thread(target=lambda: ck.save_async(model_state(2.0), step=2))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting: never two saves of one Checkpointer in flight
    writer.release.set()
    second.join(30)
    assert not second.is_alive()
    ck.wait()
    assert [r.step for r in list_checkpoints(tmp_path)] == [2, 1]


def test_if_busy_must_be_wait_or_skip(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="if_busy"):
        make(tmp_path).save_async({"n": 1}, step=1, if_busy="drop")  # type: ignore[arg-type]
    assert list_checkpoints(tmp_path) == []


def test_skip_still_reports_the_previous_failure(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(sdk_module, "write_checkpoint", broken)
    ck = make(tmp_path)
    ck.save_async({"n": 1}, step=1)
    pending = ck._pending
    assert pending is not None
    pending.join()  # finished (failed), so not busy
    with pytest.raises(RuntimeError, match="disk full"):
        ck.save_async({"n": 2}, step=2, if_busy="skip")
