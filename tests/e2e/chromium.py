"""Headless Chromium (Debian's ``chromium`` package) for the tests of web pages: the
dashboard (tests/e2e/test_dashboard.py) and the documentation site
(tests/e2e/test_docs_site.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import struct
import time
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "run scripts/install-test-deps.sh (as root or with sudo) to install it"

def chromium() -> str:
    """Chromium's path; the test fails (it does not skip) when the package is missing."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if not found:
        pytest.fail(f"{CHROMIUM} not found: the dashboard tests need Debian's chromium; "
                    f"{INSTALL_HINT}", pytrace=False)
    return found


async def browse(url: str, workdir: Path, *extra: str, budget_ms: int = 8000,
                 timeout: float = 60.0) -> tuple[str, list[str]]:
    """Run headless Chromium on ``url`` (virtual time ``budget_ms``): its stdout and the
    page's console messages (script errors, CSP violations, failed requests)."""
    workdir.mkdir(parents=True, exist_ok=True)
    profile = workdir / f"profile-{time.monotonic_ns()}"
    args = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
            "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *extra, url]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        out, err, timed_out = b"", b"", True
    finally:
        # Chromium's helpers (zygote, renderer, GPU, crashpad) are in the new session it leads:
        # end that process group (pgid = the pid we started) so none outlives the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            await proc.wait()
    shutil.rmtree(profile, ignore_errors=True)
    assert not timed_out, f"chromium ran past {timeout}s on {url} and was killed"
    assert proc.returncode == 0, (
        f"chromium failed (rc {proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    console = [line for line in err.decode(errors="replace").splitlines() if ":CONSOLE" in line]
    return out.decode("utf-8", errors="replace"), console


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file, read from its IHDR chunk."""
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def dump_dom(url: str, workdir: Path) -> tuple[str, list[str]]:
    """The page's DOM, serialized once it has loaded and refreshed a few times, and the
    console messages; fails on a script error or a Content-Security-Policy violation."""
    dom, console = await browse(url, workdir, "--dump-dom")
    broken = [m for m in console if "Uncaught" in m or "Content Security Policy" in m]
    assert not broken, f"page errors: {broken}"
    return dom, console


async def screenshot(url: str, path: Path, what: str) -> None:
    """A 1400x1000 screenshot of the page once it has loaded (``what`` names it in the
    output)."""
    await browse(url, path.parent, f"--screenshot={path}", "--window-size=1400,1000")
    assert path.is_file(), f"chromium wrote no screenshot at {path}"
    assert png_size(path) == (1400, 1000)
    assert path.stat().st_size > 20_000, "screenshot suspiciously small (blank page?)"
    print(f"{what} screenshot: {path}")
