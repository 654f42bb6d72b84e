"""Fixtures every test directory shares."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import LogCapture


@pytest.fixture
def capture() -> Iterator[LogCapture]:
    """Every line logged through structlog at info and above while the test runs."""
    cap = LogCapture()
    saved = structlog.get_config()
    structlog.configure(processors=[cap],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        yield cap
    finally:
        structlog.configure(**saved)


def _interrupt_on_sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI timeout, the lanes runner stopping) interrupts the run as Ctrl-C does, so
    every fixture's teardown still stops what the test started, by pid."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
