"""The built-in check types: ``http``, ``tcp``, ``exec``, ``process`` and ``progress``.

Each class is its type's factory: constructed from the options, it validates them with the
type's declaration in ``hafo.model.checks`` (the one the spec validation uses too;
``CheckOptionError`` names the first bad one; unknown options are refused so a typo is not
silently ignored); the runner calls its ``probe`` under the check's ``timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from hafo.checks.api import CheckContext, CheckOptionError, CheckResult
from hafo.model.checks import (
    EXEC_OPTIONS,
    HTTP_OPTIONS,
    PROCESS_OPTIONS,
    PROGRESS_OPTIONS,
    TCP_OPTIONS,
)
from hafo.model.errors import ValidationError
from hafo.model.progress import parse_heartbeat
from hafo.model.schema import Schema

HTTP_CLIENT_TIMEOUT = 30.0  # the runner's per-check timeout normally cancels the probe first
HTTP_BODY_LIMIT = 1 << 20
DETAIL_LIMIT = 200
HEARTBEAT_READ_LIMIT = 1 << 16


T = TypeVar("T")


def _options(schema: Schema[T], options: Mapping[str, Any]) -> T:
    """``options`` read with their declaration; CheckOptionError names the first bad one."""
    try:
        return schema.validate(options)
    except ValidationError as exc:
        raise CheckOptionError(exc.field, exc.message) from None


def _bounded(text: str, limit: int = DETAIL_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error(exc: BaseException) -> str:
    return _bounded(f"{type(exc).__name__}: {exc}".rstrip(": "))


class HttpCheck:
    """An HTTP request whose status (and optionally body) says healthy."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        opts = _options(HTTP_OPTIONS, options)
        self.opts = opts
        self.method = opts.method
        self.expect = frozenset(opts.expect_status)
        self.body_contains = opts.body_contains
        self.headers = dict(opts.headers)

    def _status_ok(self, status: int) -> bool:
        return status in self.expect if self.expect else 200 <= status < 400

    async def probe(self, ctx: CheckContext) -> CheckResult:
        """One request; redirects are not followed (a 3xx is the answer)."""
        timeout = aiohttp.ClientTimeout(total=HTTP_CLIENT_TIMEOUT)
        try:
            url = self.opts.target(ctx.ports)
        except KeyError:
            return CheckResult(False, f"no port named {self.opts.port!r} on this instance")
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
                    self.method, url, headers=self.headers,
                    allow_redirects=False) as resp:
                if not self._status_ok(resp.status):
                    want = ("/".join(map(str, sorted(self.expect))) if self.expect
                            else "2xx/3xx")
                    return CheckResult(False, f"status {resp.status} (expected {want})")
                if self.body_contains is not None:
                    body = b""
                    while len(body) < HTTP_BODY_LIMIT:
                        chunk = await resp.content.read(HTTP_BODY_LIMIT - len(body))
                        if not chunk:
                            break
                        body += chunk
                    if self.body_contains not in body.decode(errors="replace"):
                        return CheckResult(False, f"status {resp.status} but body lacks "
                                                  f"{_bounded(self.body_contains, 60)!r}")
                return CheckResult(True, f"status {resp.status}")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            return CheckResult(False, _error(exc))


class TcpCheck:
    """A TCP connection that opens (then is closed at once)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        opts = _options(TCP_OPTIONS, options)
        self.host = opts.host
        self.port = opts.port

    async def probe(self, ctx: CheckContext) -> CheckResult:
        """Connect and close."""
        port = ctx.ports.get(self.port) if isinstance(self.port, str) else self.port
        if port is None:
            return CheckResult(False, f"no port named {self.port!r} on this instance")
        try:
            _, writer = await asyncio.open_connection(self.host, port)
        except OSError as exc:
            return CheckResult(False, _error(exc))
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return CheckResult(True, f"connected to {self.host}:{port}")


class ExecCheck:
    """A command (argv, never a shell) in its own session; exit 0 is healthy.

    Its environment is built like the workload's: the agent's own, then the instance's
    (``ctx.env``), then the ``env`` option; ``cwd`` defaults to the agent's working directory.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        opts = _options(EXEC_OPTIONS, options)
        self.argv: list[str] = list(opts.command)
        self.env = dict(opts.env)
        self.cwd = opts.cwd

    async def probe(self, ctx: CheckContext) -> CheckResult:
        """Run the command; if cancelled (timeout, stop) its whole process group is killed."""
        env = {**os.environ, **ctx.env, **self.env}
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, env=env, cwd=self.cwd, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
        except OSError as exc:
            return CheckResult(False, f"cannot run {self.argv[0]!r}: {_error(exc)}")
        done = False
        try:
            out, err = await proc.communicate()
            done = True
        finally:
            if not done:
                # The session leader's pid is the group id; killing by pid, never by name.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    await proc.wait()
        if proc.returncode == 0:
            return CheckResult(True, "exit 0")
        lines = [ln for ln in (err or out or b"").decode(errors="replace").splitlines()
                 if ln.strip()]
        code = proc.returncode
        why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return CheckResult(False, _bounded(f"{why}: {lines[-1]}" if lines else why))


def _proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if not Path("/proc/self/stat").exists():  # no procfs: only liveness is known
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                pass
            return "R"
        return None
    except ProcessLookupError:
        return None
    return stat[stat.rindex(")") + 2:].split(" ", 1)[0]


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProcessCheck:
    """The workload's process is alive, not a zombie, not stopped, and within ``max_rss_mib``."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.max_rss_mib = _options(PROCESS_OPTIONS, options).max_rss_mib

    def probe(self, ctx: CheckContext) -> CheckResult:
        """Read /proc/<pid>/stat (and status for the RSS)."""
        if ctx.pid is None:
            return CheckResult(False, "no process (pid unknown)")
        state = _proc_state(ctx.pid)
        if state is None:
            return CheckResult(False, f"process {ctx.pid} is gone")
        if state in ("Z", "X", "x"):
            return CheckResult(False, f"process {ctx.pid} is a zombie (state {state})")
        if state in ("T", "t"):
            return CheckResult(False, f"process {ctx.pid} is stopped (state {state})")
        if self.max_rss_mib is not None:
            rss = _rss_kib(ctx.pid)
            if rss is not None and rss > self.max_rss_mib * 1024:
                return CheckResult(False, f"process {ctx.pid} uses {rss // 1024} MiB RSS "
                                          f"(max_rss_mib {self.max_rss_mib})")
        return CheckResult(True, f"process {ctx.pid} state {state}")


class ProgressCheck:
    """The workload reported progress (SDK heartbeat, or any touch of the file) recently.

    Progress is a change of the heartbeat file (another heartbeat, or another mtime or size
    of a file that is not one), timed on the agent's monotonic clock when the probe sees it:
    the heartbeat's wall-clock ``t`` and the file's mtime say only *whether* it changed, so a
    step of the machine's wall clock is no stall (docs/safety.md, "One clock per decision").
    The first probe of the instance counts as progress: a stall is ``stall_after`` seconds
    without a change after it."""

    def __init__(self, options: Mapping[str, Any],
                 clock: Callable[[], float] = time.monotonic) -> None:
        opts = _options(PROGRESS_OPTIONS, options)
        self.stall_after = opts.stall_after
        self.file = opts.file
        self.clock = clock
        self._last: tuple[object, float] | None = None  # (what was seen, when first seen)

    def path(self, ctx: CheckContext) -> Path:
        """The heartbeat file: ``file`` (relative to the checkpoint dir) or heartbeat.json.

        Its content is read as an SDK heartbeat; if it is not one, its mtime is the progress.
        """
        return ctx.checkpoint_dir / (self.file or "heartbeat.json")

    def probe(self, ctx: CheckContext) -> CheckResult:
        """Time since the heartbeat last changed (or since the first probe), on ``clock``."""
        now = self.clock()
        seen: object = None
        step = "no heartbeat yet"
        path = self.path(ctx)
        try:
            with path.open(errors="replace") as f:
                beat = parse_heartbeat(f.read(HEARTBEAT_READ_LIMIT))
            if beat is not None:
                seen, step = beat, f"last step {beat.step}"
            else:
                stat = path.stat()
                seen, step = (stat.st_mtime_ns, stat.st_size), "last step unknown"
        except FileNotFoundError:
            pass
        except OSError as exc:
            return CheckResult(False, f"cannot read {path}: {_error(exc)}")
        if self._last is None or self._last[0] != seen:
            self._last = (seen, now)
        age = now - self._last[1]
        if age > self.stall_after:
            return CheckResult(False, f"no progress for {age:.0f}s ({step})")
        return CheckResult(True, f"progress {max(age, 0.0):.0f}s ago ({step})")

