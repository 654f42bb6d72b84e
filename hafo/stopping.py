"""One way for an asyncio program to stop on a signal (SIGTERM from systemd or a CI timeout,
SIGINT from Ctrl-C): either set an event the program's loops watch, or cancel its main task.

The handlers are removed again when the ``with`` block ends, so a command that is done
leaves the process's signal dispositions as it found them. Outside the main thread (where
asyncio cannot install handlers) the block does nothing: the caller stops as it otherwise
would.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def on_signals(action: Callable[[], object],
               signals: Iterable[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """Call ``action`` (from the running event loop) when one of ``signals`` arrives while
    the block runs."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    try:
        for sig in signals:
            try:
                loop.add_signal_handler(sig, action)
            except (RuntimeError, NotImplementedError, ValueError):
                continue  # not the main thread, or no signals here: nothing to install
            installed.append(sig)
        yield
    finally:
        for sig in installed:
            with contextlib.suppress(RuntimeError, ValueError):
                loop.remove_signal_handler(sig)


@contextlib.contextmanager
def stop_on_signals(signals: Iterable[signal.Signals] = STOP_SIGNALS
                    ) -> Iterator[asyncio.Event]:
    """An event set when one of ``signals`` (SIGTERM, SIGINT) arrives while the block runs."""
    stop = asyncio.Event()
    with on_signals(stop.set, signals):
        yield stop


@contextlib.contextmanager
def cancel_on_signals(task: asyncio.Future[Any],
                      signals: Iterable[signal.Signals] = STOP_SIGNALS) -> Iterator[None]:
    """Cancel ``task`` when one of ``signals`` (SIGTERM, SIGINT) arrives while the block runs
    (its ``finally`` blocks then tear down what it started)."""
    with on_signals(task.cancel, signals):
        yield
