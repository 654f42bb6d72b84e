"""Checkpoint format 4: every leaf type round trips, the data file's layout and chunk
checksums, one flipped byte is caught, format 3 stays readable, partial I/O, a crash
mid-write."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint import blobio, list_checkpoints
from hafo.checkpoint.codec import flatten, unflatten
from hafo.checkpoint.errors import CorruptCheckpoint
from hafo.checkpoint.format import (
    FORMAT,
    open_checkpoint,
    read_checkpoint,
    write_checkpoint,
)

from .conftest import make_checkpointer as make

pytestmark = pytest.mark.usefixtures("restore_sigusr1")

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
V3_FIXTURE = Path(__file__).parent / "data" / "checkpoint_v3"


def every_leaf() -> dict[str, Any]:
    """One of every supported leaf, tensors of several dtypes and strides included."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(6, 8, generator=gen)
    grid = np.arange(48, dtype=np.float32).reshape(6, 8)
    return {
        "none": None, "true": True, "false": False, "int": -(2 ** 62), "float": 2.5,
        "str": "résumé", "bytes": b"\x00\xffdata", "empty_bytes": b"",
        "list": [1, "two", [3.0, None]], "tuple": (1, (2, "x")), "empty": {},
        "int_keys": {0: {"step": torch.tensor(3.0)}, 7: [b"seven"]},
        "np": {
            "f32": grid, "transposed": grid.T, "strided": grid[::2, 1::3],
            "zero_d": np.array(4.25), "f16": grid.astype(np.float16),
            "i8": np.arange(-5, 5, dtype=np.int8), "u64": np.array([2 ** 64 - 1], np.uint64),
            "bool": np.array([True, False, True]), "c128": np.array([1 + 2j, -3j]),
            "big_endian": np.arange(4, dtype=">i4"), "empty": np.zeros((0, 3)),
            "scalar": np.float32(1.5),
        },
        "torch": {
            "f32": base, "f64": base.double(), "f16": base.half(), "bf16": base.bfloat16(),
            "i64": torch.arange(-4, 4), "u8": torch.arange(250, 256, dtype=torch.uint8),
            "bool": base > 0, "c64": torch.complex(base, -base), "zero_d": torch.tensor(7),
            "empty": torch.empty(0, 5), "transposed": base.T, "strided": base[1::2, ::3],
            "conj": torch.complex(base, base).conj(), "param": torch.nn.Parameter(base * 2),
            "big": torch.randn(700_000, generator=gen),  # a few MiB: several extents
        },
    }


def assert_same(expected: Any, actual: Any, where: str = "state") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected), where
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert actual.is_contiguous() and actual.device.type == "cpu", where
        assert torch.equal(actual, expected.detach().resolve_conj()), where
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert actual.flags.c_contiguous and actual.flags.writeable, where
        assert np.array_equal(actual, expected), where
    elif isinstance(expected, np.generic):
        assert actual == expected.item() and type(actual) is type(expected.item()), where
    else:
        assert type(actual) is type(expected) and actual == expected, where


@pytest.mark.parametrize("how", ["save", "save_async", "read_checkpoint"])
def test_every_leaf_type_round_trips(tmp_path: Path, how: str) -> None:
    state = every_leaf()
    ck = make(tmp_path)
    if how == "save_async":
        assert ck.save_async(state, step=4) is True
        ck.wait()
    else:
        ck.save(state, step=4)
    if how == "read_checkpoint":  # the lower-level API (sharded checkpoints build on it)
        tree, blobs = read_checkpoint(list_checkpoints(tmp_path)[0])
        restored = unflatten(tree, blobs)
    else:
        loaded = ck.load_latest()
        assert loaded is not None and loaded.step == 4
        restored = loaded.state
    assert_same(state, restored)
    restored["torch"]["f32"].add_(1)  # restored tensors are writable memory of their own
    assert not torch.equal(restored["torch"]["f32"], state["torch"]["f32"])


def test_manifest_records_format_algorithm_and_chunk_checksums(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobio, "CHUNK", 4096)
    data = os.urandom(10_000)
    ref = write_checkpoint(tmp_path, 2, 9, {"any": "tree"}, [b"abc", memoryview(data), b""])
    manifest = json.loads((ref.path / "manifest.json").read_text())
    assert manifest["format"] == FORMAT == "hafo-ckpt/4"
    blobs = manifest["blobs"]
    assert [b["offset"] for b in blobs] == [0, 64, 64 + 10_000 + 48]  # aligned to 64
    assert all(b["checksum"] == "crc32c" and b["chunk"] == 4096 for b in blobs)
    crc32c = blobio.CHECKSUMS["crc32c"]
    assert blobs[1]["crcs"] == [crc32c(data[i:i + 4096]) for i in range(0, 10_000, 4096)]
    assert blobs[2]["crcs"] == [] and blobs[0]["crcs"] == [crc32c(b"abc")]
    raw = (ref.path / "data.bin").read_bytes()
    assert raw[:3] == b"abc" and raw[3:64] == bytes(61) and raw[64:10_064] == data
    tree, read = read_checkpoint(ref)
    assert tree == {"any": "tree"}
    assert [bytes(b) for b in read] == [b"abc", data, b""]


def test_ready_is_called_once_per_chunk_before_it_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobio, "CHUNK", 1024)
    payload = bytearray(5000)
    calls = []

    def ready(blob: int, chunk: int) -> None:  # e.g. a device-to-host copy landing now
        calls.append((blob, chunk))
        if blob == 1:
            part = payload[chunk * 1024:(chunk + 1) * 1024]
            payload[chunk * 1024:(chunk + 1) * 1024] = bytes([chunk + 1]) * len(part)

    ref = write_checkpoint(tmp_path, 1, 1, {}, [b"x", payload], ready)
    assert sorted(calls) == [(0, 0)] + [(1, c) for c in range(5)]
    _tree, blobs = read_checkpoint(ref)
    assert bytes(blobs[1]) == bytes(payload)  # what ready() put there is what got written
    assert bytes(blobs[1])[:1] == b"\x01" and bytes(blobs[1])[-1:] == b"\x05"


def test_writer_error_commits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobio, "CHUNK", 1024)
    monkeypatch.setattr(blobio, "EXTENT", 1024)

    def ready(blob: int, chunk: int) -> None:
        if chunk == 7:
            raise OSError("device lost")

    with pytest.raises(OSError, match="device lost"):
        write_checkpoint(tmp_path, 1, 1, {}, [bytes(20_000)], ready)
    assert list(tmp_path.iterdir()) == []  # neither a checkpoint nor a temp dir


@pytest.mark.parametrize("position", ["first", "middle", "last", "small-blob"])
def test_one_flipped_byte_is_caught_and_skipped(tmp_path: Path, position: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobio, "CHUNK", 64 * 1024)
    ck = make(tmp_path, keep_last=5)
    big = np.arange(200_000, dtype=np.float64)  # 1.6 MB: many chunks
    ck.save({"w": big, "b": b"older"}, step=1)
    newest = Path(ck.save({"w": big + 1, "b": b"newer"}, step=2))
    opened = open_checkpoint(list_checkpoints(tmp_path)[0])
    w, b = opened.blobs[0], opened.blobs[1]
    offset = {"first": w.offset, "middle": w.offset + w.size // 2 + 3,
              "last": w.offset + w.size - 1, "small-blob": b.offset + 2}[position]
    with open(newest / "data.bin", "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))
    blob = 1 if position == "small-blob" else 0
    with pytest.raises(CorruptCheckpoint, match=f"blob {blob} checksum mismatch"):
        read_checkpoint(list_checkpoints(tmp_path)[0])
    restored = ck.load_latest()
    assert restored is not None and restored.step == 1
    assert restored.state["b"] == b"older" and np.array_equal(restored.state["w"], big)


def test_bad_manifest_records_are_corrupt(tmp_path: Path) -> None:
    ck = make(tmp_path)
    path = Path(ck.save({"w": np.ones(10)}, step=1))
    manifest = json.loads((path / "manifest.json").read_text())
    bads: list[dict[str, Any]] = [{"checksum": "md5"}, {"crcs": []}, {"chunk": 0}]
    for bad in bads:
        edited = dict(manifest, blobs=[dict(manifest["blobs"][0], **bad)])
        (path / "manifest.json").write_text(json.dumps(edited))
        with pytest.raises(CorruptCheckpoint):
            open_checkpoint(list_checkpoints(tmp_path)[0])
        assert ck.load_latest() is None


def v3_checkpoints(tmp_path: Path) -> Path:
    root = tmp_path / "v3"
    shutil.copytree(V3_FIXTURE, root)
    return root


def test_format_3_made_by_the_previous_version_is_readable(tmp_path: Path) -> None:
    root = v3_checkpoints(tmp_path)
    assert json.loads(next(root.glob("ckpt-*/manifest.json")).read_text())["format"] \
        == "hafo-ckpt/3"
    restored = make(root).load_latest()
    assert restored is not None and (restored.epoch, restored.step) == (1, 5)
    state = restored.state
    assert {k: state[k] for k in ("step", "name", "none", "flag", "lr", "blob")} == {
        "step": 5, "name": "v3", "none": None, "flag": True, "lr": 0.5,
        "blob": b"\x00\x01\x02old"}
    assert np.array_equal(state["np"], np.arange(12, dtype=np.float64).reshape(3, 4))
    assert np.array_equal(state["np0d"], np.array([7], dtype=np.int32))  # format 3 made it 1-d
    assert torch.equal(state["t32"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert state["bf16"].dtype == torch.bfloat16
    assert torch.equal(state["bf16"], torch.arange(4, dtype=torch.bfloat16))
    assert torch.equal(state["optim"]["state"][0]["exp_avg"], torch.ones(3))
    assert state["optim"]["groups"] == [{"lr": 0.1}] and state["optim"]["pair"] == (1, "x")
    tree, blobs = read_checkpoint(list_checkpoints(root)[0])
    assert unflatten(tree, blobs)["name"] == "v3"


def test_format_3_corruption_is_caught(tmp_path: Path) -> None:
    root = v3_checkpoints(tmp_path)
    data = next(root.glob("ckpt-*/data.bin"))
    raw = bytearray(data.read_bytes())
    raw[10] ^= 0x40
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        read_checkpoint(list_checkpoints(root)[0])
    assert make(root).load_latest() is None


def test_partial_reads_and_writes_are_completed(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blobio, "CHUNK", 4096)
    real_pwritev, real_preadv = os.pwritev, os.preadv
    calls = {"w": 0, "r": 0}

    def short_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls["w"] += 1
        first = buffers[0][:777]  # the kernel may write less than asked
        return real_pwritev(fd, [first], offset)

    def short_preadv(fd: int, buffers: list[memoryview], offset: int) -> int:
        calls["r"] += 1
        return real_preadv(fd, [buffers[0][:555]], offset)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    monkeypatch.setattr(os, "preadv", short_preadv)
    state = {"a": np.arange(5000, dtype=np.int32), "b": b"tail" * 100, "c": torch.ones(33)}
    ck = make(tmp_path)
    ck.save(state, step=1)
    restored = ck.load_latest()
    assert restored is not None
    assert_same(state, restored.state)
    assert calls["w"] > 20 and calls["r"] > 20


def test_truncated_data_file_is_corrupt(tmp_path: Path) -> None:
    ck = make(tmp_path, keep_last=5)
    ck.save({"v": 1}, step=1)
    path = Path(ck.save({"w": np.ones(1000)}, step=2))
    with open(path / "data.bin", "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CorruptCheckpoint, match="bytes, expected"):
        open_checkpoint(list_checkpoints(tmp_path)[0])
    restored = ck.load_latest()
    assert restored is not None and restored.state == {"v": 1}


@pytest.mark.parametrize("bad", [np.array([object()]), torch.eye(3).to_sparse()])
def test_arrays_without_raw_bytes_are_refused(tmp_path: Path, bad: Any) -> None:
    ck = make(tmp_path)
    with pytest.raises(TypeError, match="cannot checkpoint"):
        ck.save({"bad": bad}, step=1)
    with pytest.raises(TypeError, match="cannot checkpoint"):
        ck.save_async({"bad": bad}, step=2)
    with pytest.raises(TypeError, match="cannot checkpoint"):
        flatten({"bad": bad}, [])
    assert list_checkpoints(tmp_path) == []


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from hafo.checkpoint import Checkpointer, blobio

    root, marker = Path(sys.argv[1]), Path(sys.argv[2])
    ck = Checkpointer(root, epoch=1, handle_signal=False)
    ck.save({"w": np.zeros(1000), "step": 1}, step=1)
    real = blobio._pwritev_all
    def slow(fd, buffers, offset):
        real(fd, buffers, offset)
        marker.write_text("writing")  # part of step 2 is on disk: kill me now
        time.sleep(60)
    blobio._pwritev_all = slow
    ck.save({"w": np.ones(3_000_000), "step": 2}, step=2)
    print("not killed", flush=True)
""")


def test_crash_mid_write_leaves_the_previous_checkpoint_newest(tmp_path: Path) -> None:
    root, marker = tmp_path / "ck", tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(marker)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never started writing step 2"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert [r.step for r in list_checkpoints(root)] == [1]
    assert [p.name.startswith(".tmp-") for p in root.iterdir()
            if not p.name.startswith("heartbeat")].count(True) == 1  # the partial write
    restored = make(root).load_latest()
    assert restored is not None and restored.step == 1 and restored.state["step"] == 1
    assert np.array_equal(restored.state["w"], np.zeros(1000))
