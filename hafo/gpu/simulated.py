"""Simulated GPUs for machines without them: inventory from config, faults from a JSON file.

The faults file (docs/reference/simulation.md, "Simulated GPUs and the faults file") maps a
GPU index to a fault, e.g. ``{"0": {"xid": 79}}``, ``{"1": {"ecc_dbe": 1}}``, ``{"2":
{"lost": true}}``. It is re-read on every call; an absent file or ``{}`` means healthy. Each
key of a GPU's entry becomes a finding (see ``hafo.model.health``): ``xid`` (number),
``ecc_dbe`` (count), ``ecc_sbe_rate`` (per hour), ``thermal`` (degrees C at or above
slowdown), ``pcie_replay`` (per minute), ``recovery_action`` (NVML value), and the flags
``lost``, ``remap_pending``, ``remap_failed``, ``retired_pages_pending``, ``hw_slowdown``,
``hw_thermal_slowdown``, ``hw_power_brake``. A fault stays while it is in the file, as a
persistent hardware fault would.

``utilization`` (GPU index -> percent) is reported with the inventory (unlisted: unknown).

Telemetry (``telemetry()``, for metrics only) is deterministic: utilization as configured (0
when unlisted), temperature ``35 + 0.4 * utilization`` C, power ``70 + 6.3 * utilization`` W,
no framebuffer memory used. The faults file may override each reading of a GPU with the keys
``temperature`` (C), ``power`` (W), ``utilization`` (%) and ``memory_used`` (MiB), e.g.
``{"0": {"temperature": 91}}``; these are readings, not faults (a ``thermal`` fault without a
``temperature`` shows as the temperature too). A ``lost`` GPU has no readings. Each new ``xid``
value of a GPU (seen by ``findings()``) counts as one Xid event.
``mig`` (GPU index -> profiles like "1g.10gb") puts a GPU in MIG mode: it is listed as one
MIG device per profile instead (index ``mig_index(gpu, slot)``, a stable "MIG-..." UUID, the
profile's memory); faults still name the physical GPU.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from hafo.gpu.base import GpuSample
from hafo.model import health as h
from hafo.model.cluster import Gpu, mig_index
from hafo.model.health import Finding
from hafo.model.names import mig_profile_mib

log = structlog.get_logger("hafo.gpu")

IDLE_C, C_PER_PCT = 35.0, 0.4      # simulated temperature: idle, and rise per percent busy
IDLE_W, W_PER_PCT = 70.0, 6.3      # simulated power draw: idle, and rise per percent busy


class SimulatedGpus:
    """A node's simulated GPUs."""

    def __init__(self, node: str, count: int, model: str, memory_mib: int,
                 faults_file: str | None = None, *,
                 utilization: Mapping[int, float] | None = None,
                 mig: Mapping[int, tuple[str, ...]] | None = None) -> None:
        self.node = node
        self.count = count
        self.model = model
        self.memory_mib = memory_mib
        self.faults_file = Path(faults_file) if faults_file else None
        self.utilization = dict(utilization or {})
        self.mig = {i: tuple(p) for i, p in (mig or {}).items() if 0 <= i < count}
        self.description = f"{count} simulated {model}" + (
            f" ({len(self.mig)} in MIG mode)" if self.mig else "")
        self._faults: dict[int, dict[str, Any]] = {}  # the faults file's last good content
        self._faults_text: str | None = None  # ... and its text
        self._refused: str | None = None  # the text last refused (warned about once)
        self._xid_seen: dict[int, int] = {}   # GPU -> the xid value in the file now
        self._xid_count: dict[int, int] = {}  # GPU -> Xid events counted
        self._last_xid: dict[int, int] = {}

    def uuid(self, index: int) -> str:
        """A stable, node-unique UUID in NVIDIA's textual form."""
        digest = hashlib.sha256(f"{self.node}/{index}".encode()).hexdigest()
        return (f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                f"{digest[20:32]}")

    def mig_uuid(self, parent: int, slot: int) -> str:
        """A stable, node-unique MIG device UUID in NVIDIA's textual form."""
        digest = hashlib.sha256(f"{self.node}/{parent}/mig/{slot}".encode()).hexdigest()
        return (f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                f"{digest[20:32]}")

    def faults(self) -> dict[int, dict[str, Any]]:
        """The faults file's content by GPU index; an absent or empty file means healthy. A
        file that cannot be read or is not of the documented shape keeps the last good
        content (a half-written file must not clear a real fault), warned about once per
        content."""
        if self.faults_file is None:
            return {}
        try:
            with self.faults_file.open("rb") as handle:
                text = handle.read(MAX_FAULTS_BYTES + 1).decode()
        except FileNotFoundError:
            self._faults, self._faults_text, self._refused = {}, None, None
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            self._refuse(f"<unreadable: {exc}>", f"cannot be read: {exc}")
            return self._faults
        if text == self._faults_text:
            return self._faults
        try:
            parsed = parse_faults(text)
        except ValueError as exc:
            self._refuse(text, str(exc))
            return self._faults
        self._faults, self._faults_text, self._refused = parsed, text, None
        return parsed

    def _refuse(self, text: str, why: str) -> None:
        if text != self._refused:
            self._refused = text
            log.warning("faults file refused: the last good content is kept",
                        path=str(self.faults_file), error=why)

    def inventory(self) -> list[Gpu]:
        """Every simulated GPU, or its MIG devices if it is in MIG mode."""
        out: list[Gpu] = []
        for i in range(self.count):
            profiles = self.mig.get(i)
            if profiles is None:
                out.append(Gpu(index=i, uuid=self.uuid(i), model=self.model,
                               memory_mib=self.memory_mib,
                               utilization=self.utilization.get(i)))
                continue
            for slot, profile in enumerate(profiles):
                out.append(Gpu(index=mig_index(i, slot), uuid=self.mig_uuid(i, slot),
                               model=self.model,
                               memory_mib=min(mig_profile_mib(profile) or 0, self.memory_mib),
                               profile=profile, parent=i))
        return out

    def findings(self) -> list[Finding]:
        """The faults file as findings; unknown keys and bad values are logged and skipped."""
        out: list[Finding] = []
        faults = self.faults()
        for index, fault in sorted(faults.items()):
            if not 0 <= index < self.count:
                continue
            for key, value in sorted(fault.items()):
                if key in _READINGS:
                    continue
                finding = _finding(index, key, value)
                if finding is None:
                    log.warning("unknown simulated fault", gpu=index, fault=key, value=value)
                elif finding.kind:
                    out.append(finding)
                    if finding.kind == h.XID and finding.code is not None:
                        self._count_xid(index, finding.code)
        for index in [i for i in self._xid_seen if "xid" not in faults.get(i, {})]:
            del self._xid_seen[index]  # cleared: the same xid written again is a new event
        return out

    def _count_xid(self, index: int, xid: int) -> None:
        if self._xid_seen.get(index) != xid:
            self._xid_seen[index] = xid
            self._xid_count[index] = self._xid_count.get(index, 0) + 1
            self._last_xid[index] = xid

    def telemetry(self) -> list[GpuSample]:
        """Each physical GPU's simulated readings (see the module docstring)."""
        faults = self.faults()
        out: list[GpuSample] = []
        for index in range(self.count):
            fault = faults.get(index, {})
            count, last = self._xid_count.get(index, 0), self._last_xid.get(index)
            if fault.get("lost"):
                out.append(GpuSample(index, self.uuid(index), self.model, xid_count=count,
                                     last_xid=last))
                continue
            util = _reading(fault, "utilization", self.utilization.get(index, 0.0))
            usual = IDLE_C + C_PER_PCT * util
            hot = _reading(fault, "thermal", usual) if fault.get("thermal") else usual
            used = min(max(_reading(fault, "memory_used", 0.0), 0.0), float(self.memory_mib))
            out.append(GpuSample(
                index, self.uuid(index), self.model,
                temperature_c=_reading(fault, "temperature", hot),
                power_w=_reading(fault, "power", IDLE_W + W_PER_PCT * util),
                utilization_pct=util, memory_used_mib=used,
                memory_free_mib=float(self.memory_mib) - used, xid_count=count, last_xid=last))
        return out

    def close(self) -> None:
        """Nothing to release."""


_READINGS = ("temperature", "power", "utilization", "memory_used")  # telemetry, not faults

#: The largest faults file read (one entry per GPU: a few hundred bytes).
MAX_FAULTS_BYTES = 1024 * 1024


def parse_faults(text: str) -> dict[int, dict[str, Any]]:
    """A faults file's text as GPU index -> its entry (empty entries left out); ValueError
    naming what is wrong: not JSON, not an object, a key that is not a GPU index, an entry
    that is not an object."""
    if len(text) > MAX_FAULTS_BYTES:
        raise ValueError(f"over {MAX_FAULTS_BYTES // 1024} KiB")
    try:
        raw = json.loads(text or "{}")
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"the file is one JSON object of GPU index -> faults, not "
                         f"{type(raw).__name__}")
    out: dict[int, dict[str, Any]] = {}
    for key, entry in raw.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 6):
            raise ValueError(f"key {key!r}: a GPU index (0, 1, ...)")
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"GPU {key}: an object of faults such as {{\"xid\": 79}}, not "
                             f"{type(entry).__name__}")
        if entry:
            out[int(key)] = dict(entry)
    return out


def _reading(fault: Mapping[str, Any], key: str, default: float) -> float:
    """A telemetry reading from a GPU's faults-file entry, or ``default``."""
    value = fault.get(key)
    if value is None or isinstance(value, bool):
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


_CODED = {"xid": h.XID, "recovery_action": h.RECOVERY_ACTION}
_VALUED = {"ecc_dbe": h.ECC_DBE, "ecc_sbe_rate": h.ECC_SBE_RATE, "thermal": h.THERMAL,
           "pcie_replay": h.PCIE_REPLAY}
_FLAGS = {"lost": h.LOST, "remap_pending": h.REMAP_PENDING, "remap_failed": h.REMAP_FAILED,
          "retired_pages_pending": h.RETIRED_PAGES_PENDING, "hw_slowdown": h.HW_SLOWDOWN,
          "hw_thermal_slowdown": h.HW_THERMAL_SLOWDOWN, "hw_power_brake": h.HW_POWER_BRAKE}


def _finding(gpu: int, key: str, value: Any) -> Finding | None:
    """One faults-file entry as a finding; ``Finding("")`` for an entry that says "no fault"
    (false, 0), None for an unknown key or a bad value."""
    if isinstance(value, bool) and key not in _FLAGS:
        return None
    try:
        if key in _CODED:
            return Finding(_CODED[key], gpu, code=int(value), detail="simulated")
        if key in _VALUED:
            number = float(value)
            return Finding(_VALUED[key], gpu, value=number, detail="simulated") if number \
                else Finding("")
        if key in _FLAGS:
            return Finding(_FLAGS[key], gpu, detail="simulated") if value else Finding("")
    except (TypeError, ValueError):
        return None
    return None
