"""Check types by name: the built-ins, then entry points in the group ``hafo.checks``.

A built-in type always wins: an entry point with a built-in's name is ignored with a warning.
Entry points are looked up when a type is first asked for and their factories are cached, so
a plugin module is imported once per process (``clear_cache`` forgets them, for tests).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any

import structlog

from hafo.checks.api import ENTRY_POINT_GROUP, Check, CheckFactory, CheckOptionError
from hafo.checks.builtin import ExecCheck, HttpCheck, ProcessCheck, ProgressCheck, TcpCheck

log = structlog.get_logger("hafo.checks")

BUILTIN: dict[str, CheckFactory] = {
    "http": HttpCheck,
    "tcp": TcpCheck,
    "exec": ExecCheck,
    "process": ProcessCheck,
    "progress": ProgressCheck,
}

_lock = threading.Lock()
_loaded: dict[str, CheckFactory] = {}
_warned: set[tuple[str, str]] = set()


class UnknownCheckType(LookupError):
    """No built-in and no installed plugin provides this check type."""

    def __init__(self, type: str, available: Mapping[str, str] | None = None) -> None:
        names = sorted(available or {})
        super().__init__(f"unknown check type {type!r} (available: {', '.join(names) or 'none'};"
                         f" plugins register under the entry-point group {ENTRY_POINT_GROUP!r})")
        self.type = type
        self.available = names


class CheckLoadError(RuntimeError):
    """A plugin could not be imported, or its factory failed with something else than
    ``CheckOptionError``; ``__cause__`` is the original exception."""

    def __init__(self, type: str, message: str) -> None:
        super().__init__(f"check type {type!r}: {message}")
        self.type = type


def _cls(obj: object) -> str:
    return type(obj).__name__


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", None) or ep.value)


def _discover() -> dict[str, EntryPoint]:
    """Installed plugin entry points by name, the first of each name; built-ins left out."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTIN:
            key = (ep.name, _origin(ep))
            with _lock:
                new = key not in _warned
                _warned.add(key)
            if new:
                log.warning("check plugin ignored: a built-in type has its name",
                            type=ep.name, plugin=_origin(ep), entry_point=ep.value)
            continue
        found.setdefault(ep.name, ep)
    return found


def available_types() -> dict[str, str]:
    """Every usable check type and where it comes from: "builtin" or the distribution name."""
    out = dict.fromkeys(BUILTIN, "builtin")
    for name, ep in sorted(_discover().items()):
        out[name] = _origin(ep)
    return out


def _factory(type: str) -> CheckFactory:
    factory = BUILTIN.get(type)
    if factory is not None:
        return factory
    with _lock:
        cached = _loaded.get(type)
    if cached is not None:
        return cached
    ep = _discover().get(type)
    if ep is None:
        raise UnknownCheckType(type, available_types())
    try:
        loaded = ep.load()
    except Exception as exc:
        raise CheckLoadError(type, f"cannot load plugin {_origin(ep)} ({ep.value}): "
                                   f"{_cls(exc)}: {exc}") from exc
    if not callable(loaded):
        raise CheckLoadError(type, f"entry point {ep.value} is not callable")
    with _lock:
        return _loaded.setdefault(type, loaded)


def load_check(type: str, options: Mapping[str, Any]) -> Check:
    """A configured check of ``type`` (a built-in or a plugin) for ``options``.

    Raises ``UnknownCheckType``, ``CheckLoadError`` (the plugin does not import, its factory
    fails, or what it returns has no ``probe``) or the factory's ``CheckOptionError``.
    """
    factory = _factory(type)
    try:
        check = factory(MappingProxyType(dict(options)))
    except CheckOptionError:
        raise
    except Exception as exc:
        raise CheckLoadError(type, f"factory failed: {_cls(exc)}: {exc}") from exc
    if not callable(getattr(check, "probe", None)):
        raise CheckLoadError(type, f"factory returned {_cls(check)} without a probe()")
    return check


def clear_cache() -> None:
    """Forget loaded plugin factories and the shadowing warnings already given."""
    with _lock:
        _loaded.clear()
        _warned.clear()
