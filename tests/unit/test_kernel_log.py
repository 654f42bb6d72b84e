"""Kernel-log Xid parsing, burst debouncing and the non-blocking reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hafo.gpu.kernel_log import (
    KernelLogReader,
    XidBursts,
    XidRecord,
    normalise_bus_id,
    parse_xid_line,
)

PARSED = [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
     XidRecord("0000:3b:00", 79, "GPU has fallen off the bus.", 1234, "python")),
    ("[12345.678] NVRM: Xid (PCI:0000:b1:00): 48, pid='<unknown>', name=<unknown>, An "
     "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
     "partition 0, subpartition 0.",
     XidRecord("0000:b1:00", 48, "An uncorrectable double bit error (DBE) has been detected on "
               "GPU in the framebuffer at partition 0, subpartition 0.")),
    ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): "
     "Out Of Range Address",
     XidRecord("0000:3b:00", 13, "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of "
               "Range Address")),
    ("4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=..., Ch 00000010, intr 10000000. "
     "MMU Fault: ENGINE GRAPHICS",
     XidRecord("0000:3b:00", 31, "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS")),
    ("kernel: [ 9.1] NVRM: Xid (PCI:0000:17:00): 119, pid=9, name=nvidia-smi, Timeout after 6s",
     XidRecord("0000:17:00", 119, "Timeout after 6s", 9, "nvidia-smi")),
    ("NVRM: Xid (PCI:0000:3B:00): 94, Contained ECC error.",
     XidRecord("0000:3b:00", 94, "Contained ECC error.")),
    ("NVRM: Xid (PCI:0000:87:00 GPU-I:02): 43, pid=77, name=train, Ch 00000008",
     XidRecord("0000:87:00", 43, "Ch 00000008", 77, "train")),
    ("NVRM: Xid (PCI:0001:3b:00.0): 74, NVLink: fatal error",
     XidRecord("0001:3b:00", 74, "NVLink: fatal error")),
    ("NVRM: Xid (PCI:0000:3b:00): 79", XidRecord("0000:3b:00", 79, "")),
    (b"6,99,1,-;NVRM: Xid (PCI:0000:3b:00): 63, Row remapping event\n",
     XidRecord("0000:3b:00", 63, "Row remapping event")),
]

GARBAGE = [
    "",
    "random noise",
    "NVRM: GPU at PCI:0000:3b:00: GPU-12345678-1234-1234-1234-123456789abc",
    "NVRM: Xid (PCI:0000:3b:00): , no number",
    "NVRM: Xid (PCI:zz:3b:00): 79, bad bus",
    "NVRM: Xid PCI:0000:3b:00: 79, no parentheses",
    "nvidia-modeset: Xid 79 mentioned in passing",
    " SUBSYSTEM=pci",
    b"\xff\xfe garbage bytes",
]


@pytest.mark.parametrize(("line", "expected"), PARSED)
def test_parse_xid_line(line: str | bytes, expected: XidRecord) -> None:
    assert parse_xid_line(line) == expected


@pytest.mark.parametrize("line", GARBAGE)
def test_parse_rejects_other_lines(line: str | bytes) -> None:
    assert parse_xid_line(line) is None


@pytest.mark.parametrize(("raw", "expected"), [
    ("00000000:3B:00.0", "0000:3b:00"),
    ("0000:3b:00", "0000:3b:00"),
    (b"00000001:B1:00.0\x00", "0001:b1:00"),
    ("3b:00.0", "0000:3b:00"),
    ("not a bus", None),
])
def test_normalise_bus_id(raw: str | bytes, expected: str | None) -> None:
    assert normalise_bus_id(raw) == expected


def test_bursts_count_once_per_window() -> None:
    now = [100.0]
    bursts = XidBursts(window=10.0, clock=lambda: now[0])
    assert bursts.is_new("0000:3b:00", 79)
    now[0] = 101.0
    assert not bursts.is_new("0000:3b:00", 79)       # the same fault from the other source
    assert bursts.is_new("0000:3b:00", 48)            # another Xid
    assert bursts.is_new("0000:b1:00", 79)            # another GPU
    now[0] = 109.9
    assert not bursts.is_new("0000:3b:00", 79)
    now[0] = 110.0
    assert bursts.is_new("0000:3b:00", 79)            # a storm counts once per window
    assert not bursts.is_new("0000:3b:00", 79, now=115.0)
    assert bursts.is_new("0000:3b:00", 79, now=120.0)


def test_reader_reads_only_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("NVRM: Xid (PCI:0000:3b:00): 79, before start\n")
    reader = KernelLogReader(path)
    try:
        assert reader.available and reader.poll() == []
        with path.open("a") as f:
            f.write("6,1,2,-;usb 1-1: new device\n")
            f.write("4,2,3,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception\n")
            f.write("4,3,4,-;NVRM: Xid (PCI:0000:b1:00): 4")  # half a line
        assert [(r.pci_bus_id, r.xid) for r in reader.poll()] == [("0000:3b:00", 13)]
        with path.open("a") as f:
            f.write("8, Graphics Exception\n")
        assert [(r.pci_bus_id, r.xid) for r in reader.poll()] == [("0000:b1:00", 48)]
        assert reader.poll() == []
    finally:
        reader.close()


def test_reader_over_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    reader = KernelLogReader(path)
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        assert reader.available and reader.poll() == []
        os.write(writer, b"4,2,3,-;NVRM: Xid (PCI:0000:3b:00): 79, fell off\n")
        assert [r.xid for r in reader.poll()] == [79]
        assert reader.poll() == []  # EAGAIN: nothing more, no blocking
    finally:
        os.close(writer)
        reader.close()


def test_reader_degrades_without_a_log(tmp_path: Path) -> None:
    reader = KernelLogReader(tmp_path / "missing")
    assert not reader.available
    assert "cannot open" in reader.reason
    assert reader.poll() == []
    reader.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_reader_degrades_without_permission(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    path.chmod(0)
    reader = KernelLogReader(path)
    assert not reader.available and "Permission denied" in reader.reason


def test_reader_degrades_on_read_errors(tmp_path: Path) -> None:
    reader = KernelLogReader(tmp_path)  # a directory opens, but read() says EISDIR
    assert reader.available
    assert reader.poll() == []
    assert not reader.available and "cannot read" in reader.reason
    assert reader.poll() == []


def test_reader_continues_after_overwritten_records(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kmsg"
    path.write_text("")
    reader = KernelLogReader(path)
    results: list[bytes | OSError] = [
        BrokenPipeError(), b"4,9,1,-;NVRM: Xid (PCI:0000:3b:00): 79, fell off\n",
        InterruptedError(), b"6,10,2,-;other\n", BlockingIOError()]

    def fake_read(fd: int, n: int) -> bytes:
        result = results.pop(0)
        if isinstance(result, OSError):
            raise result
        return result

    monkeypatch.setattr(os, "read", fake_read)
    assert [r.xid for r in reader.poll()] == [79]
    assert reader.overwritten == 1 and reader.available and results == []
    monkeypatch.undo()
    reader.close()
