"""Access to the NVML library: loading and starting the ``pynvml`` binding, its error classes,
and contained reads that remember what a GPU or binding does not support and warn once.

Every other module of ``hafo.gpu.nvml`` goes through one ``Binding``: it holds the state they
share, the queries each GPU does not support (``skip``, not asked again) and the warnings
already given (``warn_once``).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("hafo.gpu")

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML could not be initialised (no binding, no driver, or no GPU)."""


class Missing(Exception):
    """Stands in for an NVMLError subclass an old binding lacks: never raised."""


class Unsupported(Exception):
    """A query this GPU, driver or binding does not have."""


class Binding:
    """The ``pynvml`` module (or a stand-in for tests; imported when ``nvml`` is None), its
    error classes, and what every concern shares: ``skip`` (per GPU, the queries not to ask
    again) and the warnings already given. Raises ``NvmlUnavailable`` without the binding."""

    def __init__(self, nvml: Any = None) -> None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
        self.nvml = nvml
        self.error: type[BaseException] = nvml.NVMLError
        self.lost = err(nvml, "NVMLError_GpuIsLost")
        self.timeout = err(nvml, "NVMLError_Timeout")
        self.unsupported: tuple[type[BaseException], ...] = (
            err(nvml, "NVMLError_NotSupported"), err(nvml, "NVMLError_FunctionNotFound"),
            err(nvml, "NVMLError_NoPermission"), AttributeError, Unsupported)
        self.skip: dict[int, set[str]] = collections.defaultdict(set)
        self._warned: set[tuple[Any, ...]] = set()

    def start(self) -> tuple[int, str]:
        """Initialise NVML: the number of GPUs and the driver version. Raises
        ``NvmlUnavailable`` (NVML shut down again) when NVML fails or finds no GPU."""
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
            driver = text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            self.shutdown()
            raise NvmlUnavailable(f"NVML unavailable: {exc}") from exc
        if count == 0:
            self.shutdown()
            raise NvmlUnavailable(f"NVML (driver {driver}) found no GPU")
        return count, driver

    def shutdown(self) -> None:
        """Shut NVML down; an error doing so is ignored."""
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    def read(self, index: int, name: str, query: Callable[[], T]) -> T | None:
        """One telemetry reading, contained: None if it fails (a lost GPU, any NVML error);
        a reading the GPU or binding does not support is not asked again."""
        key = f"telemetry:{name}"
        if key in self.skip[index]:
            return None
        try:
            return query()
        except self.lost:
            return None
        except self.unsupported as exc:
            self.skip[index].add(key)
            log.info("GPU reading not available", gpu=index, reading=name,
                     error=str(exc) or type(exc).__name__)
        except (self.error, TypeError, ValueError) as exc:
            self.warn_once(("telemetry", index, name), "GPU reading failed", index, exc)
        return None

    def warn_once(self, key: tuple[Any, ...], message: str, index: int | None,
                  error: object, **fields: Any) -> None:
        """Log ``message`` as a warning the first time ``key`` is seen."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, gpu=index, error=str(error), **fields)


def err(nvml: Any, name: str) -> type[BaseException]:
    """An NVMLError subclass of the binding, or one never raised if the binding lacks it."""
    cls = getattr(nvml, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else Missing


def function(nvml: Any, name: str) -> Any:
    """A function of the binding; ``Unsupported`` if this binding lacks it."""
    fn = getattr(nvml, name, None)
    if fn is None:
        raise Unsupported(f"{name} not in this binding")
    return fn


def handle_key(handle: Any) -> Any:
    """A hashable key for an NVML device handle (a ctypes pointer: its address)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def text(value: bytes | str) -> str:
    """A string NVML returned, as bytes or str (depending on the binding), as str."""
    return value.decode() if isinstance(value, bytes) else value
