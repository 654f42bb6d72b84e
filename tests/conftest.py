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
