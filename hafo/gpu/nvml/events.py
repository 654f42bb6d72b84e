"""The XID event thread: it registers every GPU for NVML's Xid (and ECC) events and waits on
them, queueing each Xid for the next health poll to drain.

A GPU without Xid events, or a driver without event sets, leaves Xids to the kernel log.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import structlog

from hafo.gpu.nvml.binding import Binding, handle_key, text
from hafo.gpu.nvml.inventory import Inventory

log = structlog.get_logger("hafo.gpu")

XidReport = tuple[float, int | None, int, str]
"""An Xid seen: when (by the clock), on which GPU (None if unknown), the Xid, a detail."""


class XidEvents:
    """NVML's Xid events, from a daemon thread (``start``) into a queue (``drain``).

    ``clock`` stamps each event; ``timeout_ms`` bounds each wait, hence how long ``stop``
    takes."""

    def __init__(self, binding: Binding, inventory: Inventory, clock: Callable[[], float],
                 timeout_ms: int) -> None:
        self._binding = binding
        self._nvml = binding.nvml
        self._inventory = inventory
        self._clock = clock
        self.timeout_ms = timeout_ms
        self._queue: collections.deque[XidReport] = collections.deque()
        self._stop = threading.Event()
        self._event_set: Any = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the event thread was started (and not yet stopped)."""
        return self._thread is not None

    def start(self) -> None:
        """Register the identified GPUs for events and start the thread; without an event
        set or any GPU registered, no thread (Xids then come from the kernel log only)."""
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except (nvml.NVMLError, AttributeError) as exc:
            log.info("NVML events unavailable, Xids from the kernel log", error=str(exc))
            return
        wanted = nvml.nvmlEventTypeXidCriticalError
        for name in ("nvmlEventTypeDoubleBitEccError", "nvmlEventTypeSingleBitEccError"):
            wanted |= getattr(nvml, name, 0)
        registered = 0
        for index, handle in self._inventory.handles.items():
            types = wanted
            with contextlib.suppress(nvml.NVMLError, AttributeError):
                types &= int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
            if not types & nvml.nvmlEventTypeXidCriticalError:
                log.info("GPU has no Xid events, Xids from the kernel log", gpu=index)
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(handle, types, self._event_set)
                registered += 1
            except nvml.NVMLError as exc:
                log.info("NVML event registration failed", gpu=index, error=str(exc))
        if not registered:
            self.free()
            return
        self._thread = threading.Thread(target=self._loop, name="hafo-nvml-events",
                                        daemon=True)
        self._thread.start()

    def drain(self) -> list[XidReport]:
        """The Xids queued since the last call, oldest first."""
        reports: list[XidReport] = []
        while self._queue:
            reports.append(self._queue.popleft())
        return reports

    def stop(self) -> bool:
        """Stop the thread (within one event wait); False if it did not stop in time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_ms / 1000 + 2)
            if self._thread.is_alive():  # pragma: no cover - a wait NVML did not end
                log.warning("NVML event thread did not stop")
                return False
            self._thread = None
        return True

    def free(self) -> None:
        """Free the event set, if there is one."""
        if self._event_set is not None:
            with contextlib.suppress(self._nvml.NVMLError, AttributeError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def _loop(self) -> None:
        nvml = self._nvml
        xid_type = nvml.nvmlEventTypeXidCriticalError
        dbe_type = getattr(nvml, "nvmlEventTypeDoubleBitEccError", 0)
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, self.timeout_ms)
            except self._binding.timeout:
                continue
            except nvml.NVMLError as exc:
                self._binding.warn_once(("event-wait", str(exc)), "NVML event wait failed",
                                        None, exc)
                self._stop.wait(self.timeout_ms / 1000)
                continue
            index = self._gpu(data.device)
            if data.eventType & xid_type:
                self._queue.append((self._clock(), index, int(data.eventData), "NVML event"))
            elif data.eventType & dbe_type:
                log.warning("NVML double-bit ECC event", gpu=index)
            else:
                log.debug("NVML event", gpu=index, type=int(data.eventType))

    def _gpu(self, device: Any) -> int | None:
        """The index of the GPU an event names (by UUID, else by handle); None if unknown."""
        with contextlib.suppress(self._nvml.NVMLError, AttributeError, TypeError):
            index = self._inventory.by_uuid.get(text(self._nvml.nvmlDeviceGetUUID(device)))
            if index is not None:
                return index
        return self._inventory.by_handle.get(handle_key(device))
