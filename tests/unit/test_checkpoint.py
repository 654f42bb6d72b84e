"""The checkpoint SDK against a tmp_path: atomic, checksummed, epoch-fenced save/restore."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint import Checkpointer, CheckpointWriteFailed, list_checkpoints
from hafo.checkpoint import sdk as sdk_module

from .conftest import make_checkpointer as make

pytestmark = pytest.mark.usefixtures("restore_sigusr1")

STATE: dict[str, Any] = {
    "step": 7,
    "lr": 0.001,
    "name": "resnet",
    "done": False,
    "missing": None,
    "history": [1, 2.5, "three", None, True],
    "shape": (3, 4),
    "nested": {"pair": ("a", b"\x00\x01"), "deep": {"list": [[1], {"x": b"xyz"}]}},
    "blob": b"\x00\xff" * 100,
    "empty": {},
}


def test_empty_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert make(tmp_path / "new").load_latest() is None
    assert (tmp_path / "new").is_dir()


def test_round_trip_of_nested_state(tmp_path: Path) -> None:
    ck = make(tmp_path, epoch=4)
    path = ck.save(STATE, step=12)
    restored = ck.load_latest()
    assert restored is not None
    assert (restored.step, restored.epoch, restored.path) == (12, 4, path)
    assert restored.state == STATE
    assert isinstance(restored.state["shape"], tuple)
    assert isinstance(restored.state["nested"]["pair"], tuple)
    assert isinstance(restored.state["history"], list)
    assert isinstance(restored.state["blob"], bytes)


def test_bytearray_and_memoryview_come_back_as_bytes(tmp_path: Path) -> None:
    ck = make(tmp_path)
    ck.save({"a": bytearray(b"abc"), "m": memoryview(b"def")}, step=1)
    restored = ck.load_latest()
    assert restored is not None and restored.state == {"a": b"abc", "m": b"def"}


def test_numpy_arrays_round_trip(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    ck = make(tmp_path)
    weights = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ck.save({"w": weights, "t": weights.T, "i": np.int64(5)}, step=1)
    restored = ck.load_latest()
    assert restored is not None
    assert restored.state["w"].dtype == np.float32 and restored.state["w"].shape == (2, 3, 4)
    assert np.array_equal(restored.state["w"], weights)
    assert np.array_equal(restored.state["t"], weights.T)
    assert restored.state["i"] == 5


def test_integer_keys_round_trip(tmp_path: Path) -> None:
    ck = make(tmp_path)
    state = {"optim": {"state": {0: {"step": 3}, 1: {"step": 4}}, "param_groups": [{"lr": 0.1}]}}
    ck.save(state, step=1)
    restored = ck.load_latest()
    assert restored is not None and restored.state == state


@pytest.mark.parametrize("bad", [{1: "int", "s": "mixed keys"}, {"obj": object()},
                                 {"s": {1, 2}}, {(1, 2): "tuple key"}])
def test_unsupported_state_is_refused(tmp_path: Path, bad: dict[Any, Any]) -> None:
    with pytest.raises(TypeError):
        make(tmp_path).save(bad, step=1)
    assert list_checkpoints(tmp_path) == []


def test_newer_epoch_beats_later_step_of_stale_epoch(tmp_path: Path) -> None:
    current = make(tmp_path, epoch=2, keep_last=10)
    zombie = make(tmp_path, epoch=1, keep_last=10)
    current.save({"who": "current"}, step=5)
    zombie.save({"who": "zombie"}, step=100)  # a stale instance's late write
    for reader in (current, zombie, make(tmp_path, epoch=3)):
        restored = reader.load_latest()
        assert restored is not None
        assert (restored.epoch, restored.step, restored.state) == (2, 5, {"who": "current"})


def test_stale_epoch_pruning_never_deletes_the_current_epoch(tmp_path: Path) -> None:
    make(tmp_path, epoch=2).save({"v": 1}, step=1)
    make(tmp_path, epoch=1, keep_last=1).save({"v": 0}, step=50)
    assert [(r.epoch, r.step) for r in list_checkpoints(tmp_path)] == [(2, 1)]


def test_same_step_saved_twice_keeps_the_newer(tmp_path: Path) -> None:
    ck = make(tmp_path)
    ck.save({"v": 1}, step=3)
    ck.save({"v": 2}, step=3)
    restored = ck.load_latest()
    assert restored is not None and restored.state == {"v": 2}
    assert len(list_checkpoints(tmp_path)) == 1


def flip_blob_byte(path: Path) -> None:
    blob = path / "data.bin"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))


def truncate_blob(path: Path) -> None:
    blob = path / "data.bin"
    blob.write_bytes(blob.read_bytes()[:-1])


def edit_manifest(path: Path, old: str, new: str) -> None:
    manifest = path / "manifest.json"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new))


CORRUPTIONS: dict[str, Callable[[Path], object]] = {
    "flip-blob-byte": flip_blob_byte,
    "truncate-blob": truncate_blob,
    "delete-blob": lambda p: (p / "data.bin").unlink(),
    "missing-manifest": lambda p: (p / "manifest.json").unlink(),
    "garbage-manifest": lambda p: (p / "manifest.json").write_text("{not json"),
    "tree-edited": lambda p: edit_manifest(p, '\\"step\\"', '\\"stop\\"'),
    "wrong-format": lambda p: edit_manifest(p, "hafo-ckpt/4", "hafo-ckpt/9"),
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupt_newest_falls_back_to_previous_good(tmp_path: Path,
                                                    corrupt: Callable[[Path], object]) -> None:
    ck = make(tmp_path, keep_last=5)
    ck.save({"step": 1, "blob": b"one" * 10}, step=1)
    newest = Path(ck.save({"step": 2, "blob": b"two" * 10}, step=2))
    corrupt(newest)
    restored = ck.load_latest()
    assert restored is not None
    assert (restored.step, restored.state) == (1, {"step": 1, "blob": b"one" * 10})


def test_all_corrupt_gives_none(tmp_path: Path) -> None:
    ck = make(tmp_path)
    (Path(ck.save({"b": b"x"}, step=1)) / "manifest.json").unlink()
    assert ck.load_latest() is None


def test_temp_dirs_are_never_loaded(tmp_path: Path) -> None:
    ck = make(tmp_path)
    ck.save({"v": 1}, step=1)
    (tmp_path / ".tmp-partial").mkdir(parents=True)
    (tmp_path / ".tmp-partial" / "data.bin").write_bytes(b"partial")
    (tmp_path / "ckpt-not-a-checkpoint").mkdir()
    restored = ck.load_latest()
    assert restored is not None and restored.state == {"v": 1}


def test_keep_last_prunes_oldest(tmp_path: Path) -> None:
    ck = make(tmp_path, keep_last=2)
    for step in range(1, 6):
        ck.save({"step": step}, step=step)
    assert [r.step for r in list_checkpoints(tmp_path)] == [5, 4]
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("ckpt-")]) == 2


def test_save_async_stages_then_commits(tmp_path: Path) -> None:
    ck = make(tmp_path, keep_last=2)
    buffer = bytearray(b"before")
    ck.save_async({"buf": buffer, "n": 1}, step=1)
    buffer[:] = b"AFTER!"  # staged to host memory already: must not leak into the write
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and restored.state == {"buf": b"before", "n": 1}
    ck.save_async({"n": 2}, step=2)
    ck.save_async({"n": 3}, step=3)  # waits for the previous write first
    restored = ck.load_latest()  # waits too
    assert restored is not None and restored.step == 3
    assert [r.step for r in list_checkpoints(tmp_path)] == [3, 2]


@pytest.mark.parametrize("next_call", ["wait", "save", "save_async", "load_latest"])
def test_failed_background_write_surfaces_on_next_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, next_call: str) -> None:
    ck = make(tmp_path)

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError("disk full")

    monkeypatch.setattr(sdk_module, "write_checkpoint", broken)
    ck.save_async({"n": 1}, step=1)  # returns: the failure happens in the background
    calls: dict[str, Callable[[], Any]] = {
        "wait": ck.wait, "save": lambda: ck.save({"n": 2}, step=2),
        "save_async": lambda: ck.save_async({"n": 2}, step=2), "load_latest": ck.load_latest}
    with pytest.raises(RuntimeError, match="disk full") as info:
        calls[next_call]()
    assert isinstance(info.value.__cause__, OSError)
    ck.wait()  # reported once, then cleared
    assert ck.load_latest() is None


def test_sigusr1_requests_a_checkpoint(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, epoch=1)
    assert not ck.should_checkpoint() and not ck.preempted
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 0.2
    while not ck.should_checkpoint() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ck.should_checkpoint() and ck.preempted


def test_handle_signal_false_leaves_sigusr1_alone(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    make(tmp_path)
    assert signal.getsignal(signal.SIGUSR1) is before


def test_directory_and_epoch_from_environment(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAFO_CHECKPOINT_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("HAFO_EPOCH", "17")
    ck = Checkpointer(handle_signal=False)
    assert (ck.root, ck.epoch) == (tmp_path / "env", 17)
    ck.save({"v": 1}, step=2)
    restored = ck.load_latest()
    assert restored is not None and (restored.epoch, restored.step) == (17, 2)


@pytest.mark.parametrize("value", [None, ""])
def test_missing_checkpoint_dir_raises(monkeypatch: pytest.MonkeyPatch,
                                       value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("HAFO_CHECKPOINT_DIR", raising=False)
    else:
        monkeypatch.setenv("HAFO_CHECKPOINT_DIR", value)
    with pytest.raises(ValueError, match="HAFO_CHECKPOINT_DIR"):
        Checkpointer(handle_signal=False)


def test_save_async_takes_its_copy_before_returning(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    ck = make(tmp_path)
    weights = np.zeros(1000, dtype=np.float32)
    ck.save_async({"w": weights}, step=1)
    weights += 1.0  # training goes on at once
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and float(restored.state["w"].sum()) == 0.0


def test_torch_tensors_round_trip_and_async_copy(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    ck = make(tmp_path)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    ck.save_async({"model": model.state_dict(), "optim": optimizer.state_dict()}, step=3)
    with torch.no_grad():
        model.weight.add_(1.0)
    ck.wait()
    restored = ck.load_latest()
    assert restored is not None and restored.step == 3
    assert not torch.equal(restored.state["model"]["weight"], model.weight.detach())
    fresh = torch.optim.Adam(torch.nn.Linear(4, 2).parameters())
    fresh.load_state_dict(restored.state["optim"])
    assert fresh.state_dict()["state"][0]["step"] == 1


@pytest.mark.parametrize("how", ["save", "save_async"])
def test_a_full_checkpoint_filesystem_is_told_to_the_workload(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Issue 28, finding 3: a full (shared) checkpoint disk no longer stops the workload; its
    checkpoint write fails with an error that says which step, where and why."""
    ck = make(tmp_path)
    ck.save({"n": 1}, step=1)

    def full(*_args: Any, **_kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sdk_module, "write_checkpoint", full)
    with pytest.raises(CheckpointWriteFailed) as info:
        if how == "save":
            ck.save({"n": 2}, step=2)
        else:
            ck.save_async({"n": 2}, step=2)
            ck.wait()
    error = info.value
    assert isinstance(error, OSError) and isinstance(error, RuntimeError)
    assert error.errno == errno.ENOSPC
    assert f"checkpoint of step 2 not written to {tmp_path}" in str(error)
    assert "the checkpoint filesystem is full" in str(error)
    assert "earlier checkpoints are kept" in str(error)
    monkeypatch.undo()
    restored = ck.load_latest()
    assert restored is not None and restored.step == 1
