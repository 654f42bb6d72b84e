"""Xid errors from the kernel log: the NVIDIA driver's ``NVRM: Xid`` lines.

The driver logs every Xid (NVIDIA's catalog: https://docs.nvidia.com/deploy/xid-errors/) to the
kernel ring buffer, e.g.::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=..., Ch 00000010, intr 10000000. ...

NVML's event API reports the same Xids, but not every Xid on every driver, and not at all when
event registration is unsupported (some virtualised GPUs); the kernel log is the second source.
Both report one fault, so ``XidBursts`` makes the two count once.

Pure parts: ``parse_xid_line``, ``normalise_bus_id`` and ``XidBursts``. ``KernelLogReader`` reads
``/dev/kmsg`` (or any file or FIFO given as ``path``) from its end, without blocking.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("hafo.gpu")

DEFAULT_KMSG = "/dev/kmsg"

_BUS = r"(?:[0-9a-f]{1,8}:)?[0-9a-f]{1,2}:[0-9a-f]{1,2}(?:\.[0-7])?"
# "(PCI:0000:3b:00)", also "(PCI:0000:3b:00 GPU-I:05)" for MIG instances and "(0000:3b:00)".
_XID_RE = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<bus>{_BUS})[^)]*\):\s*(?P<xid>\d+)\s*(?:,\s*(?P<rest>.*))?",
    re.IGNORECASE)
_PID_RE = re.compile(r"pid=(?P<pid>'[^']*'|[^,\s]*)\s*(?:,\s*|$)")
_NAME_RE = re.compile(r"name=(?P<name>[^,]*?)\s*(?:,\s*|$)")
_BUS_RE = re.compile(r"(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<dev>[0-9a-f]{1,2})"
                     r"(?:\.[0-7])?")


def normalise_bus_id(text: str | bytes) -> str | None:
    """A PCI bus id as ``dddd:bb:dd`` in lower case, without the function, so the kernel's
    ``0000:3b:00`` and NVML's ``00000000:3B:00.0`` compare equal; None if ``text`` is not one."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    m = _BUS_RE.fullmatch(text.strip().rstrip("\x00").lower())
    if m is None:
        return None
    domain = int(m["domain"] or "0", 16)
    return f"{domain:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}"


@dataclass(frozen=True)
class XidRecord:
    """One ``NVRM: Xid`` line: the GPU's PCI bus id (normalised), the Xid number, and the
    driver's description. ``pid``/``process`` are the process the driver blamed, when it did."""

    pci_bus_id: str
    xid: int
    message: str
    pid: int | None = None
    process: str | None = None


def parse_xid_line(line: str | bytes) -> XidRecord | None:
    """Parse one kernel log line (plain, dmesg-timestamped, or a ``/dev/kmsg`` record such as
    ``4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, ...``); None unless it is an Xid line.
    Xid meanings: https://docs.nvidia.com/deploy/xid-errors/."""
    if isinstance(line, bytes):
        line = line.decode(errors="replace")
    m = _XID_RE.search(line)
    if m is None:
        return None
    bus = normalise_bus_id(m["bus"])
    if bus is None:  # pragma: no cover - the regex only admits valid bus ids
        return None
    rest = (m["rest"] or "").strip()
    pid: int | None = None
    process: str | None = None
    pm = _PID_RE.match(rest)
    if pm:
        raw = pm["pid"].strip("'")
        pid = int(raw) if raw.isdigit() else None
        rest = rest[pm.end():]
    nm = _NAME_RE.match(rest)
    if nm:
        name = nm["name"].strip()
        process = None if name in ("", "<unknown>") else name
        rest = rest[nm.end():]
    return XidRecord(pci_bus_id=bus, xid=int(m["xid"]), message=rest.strip(), pid=pid,
                     process=process)


class XidBursts:
    """Debounce Xid reports: one count per burst of the same (device, Xid).

    A burst starts at the first report of a pair and lasts ``window`` seconds; reports of the
    pair inside it belong to it. So the NVML event and the kernel log line of one fault count
    once, and a continuing storm (Xid 13 every second, say) counts once per window, which keeps
    the GPU's fault fresh without flooding. ``device`` is any hashable key (bus id, GPU index).
    """

    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._started: dict[tuple[Hashable, int], float] = {}

    def is_new(self, device: Hashable, xid: int, now: float | None = None) -> bool:
        """Whether this report starts a new burst (and so should be counted)."""
        now = self.clock() if now is None else now
        key = (device, xid)
        start = self._started.get(key)
        if start is not None and now - start < self.window:
            return False
        self._started[key] = now
        if len(self._started) > 4096:
            self._started = {k: t for k, t in self._started.items() if now - t < self.window}
        return True


class KernelLogReader:
    """New Xid records from the kernel log since the last ``poll()``.

    Opens ``path`` (``/dev/kmsg`` by default) non-blocking and seeks to its end, so only Xids
    logged after start are seen. Each ``/dev/kmsg`` ``read`` returns one record; ``EAGAIN`` means
    none is left, ``EPIPE`` that the ring buffer overwrote records we had not read yet (reading
    continues at the oldest one left). A regular file or a FIFO works too (for tests): reads stop
    at end of file and a partial last line waits for its newline. When the log cannot be opened
    or read (no ``/dev/kmsg`` in a container, ``dmesg_restrict`` without CAP_SYSLOG),
    ``available`` is False, ``reason`` says why (logged once) and ``poll()`` returns nothing.
    """

    READ_SIZE = 8192       # a /dev/kmsg record is at most ~1 KiB; a too-small buffer is EINVAL
    MAX_READS = 4096       # per poll: a flood of kernel messages cannot hold the caller forever

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_KMSG) -> None:
        self.path = os.fspath(path)
        self.available = False
        self.reason = ""
        self.overwritten = 0  # how many times EPIPE said records were lost
        self._fd: int | None = None
        self._partial = b""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self._disable(f"cannot open {self.path}: {exc.strerror or exc}")
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError as exc:
            if exc.errno != errno.ESPIPE:  # a FIFO cannot seek: it has no backlog either
                os.close(fd)
                self._disable(f"cannot seek {self.path}: {exc.strerror or exc}")
                return
        self._fd = fd
        self.available = True

    def _disable(self, reason: str) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.available = False
        self.reason = reason
        log.warning("kernel log unavailable, Xids come from NVML events only", path=self.path,
                    reason=reason)

    def poll(self) -> list[XidRecord]:
        """Read what was appended since the last call; return its Xid records, oldest first."""
        if self._fd is None:
            return []
        data = bytearray(self._partial)
        for _ in range(self.MAX_READS):
            try:
                chunk = os.read(self._fd, self.READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:
                self.overwritten += 1
                log.debug("kernel log records overwritten before they were read", path=self.path)
                continue
            except InterruptedError:
                continue
            except OSError as exc:
                self._disable(f"cannot read {self.path}: {exc.strerror or exc}")
                break
            if not chunk:
                break
            data += chunk
        lines = bytes(data).split(b"\n")
        self._partial = lines.pop()  # b"" after a final newline
        out: list[XidRecord] = []
        for raw in lines:
            record = parse_xid_line(raw)
            if record is not None:
                out.append(record)
        return out

    def close(self) -> None:
        """Close the log."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
