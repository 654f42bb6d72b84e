"""The built-in check types: ``http``, ``tcp``, ``exec``, ``process`` and ``progress``.

Each class is its type's factory: constructed from the options, it validates them
(``CheckOptionError`` names the first bad one; unknown options are refused so a typo is not
silently ignored); the runner calls its ``probe`` under the check's ``timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from hafo.checks.api import CheckContext, CheckOptionError, CheckResult
from hafo.model.progress import parse_heartbeat

HTTP_CLIENT_TIMEOUT = 30.0  # the runner's per-check timeout normally cancels the probe first
HTTP_BODY_LIMIT = 1 << 20
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
DETAIL_LIMIT = 200
HEARTBEAT_READ_LIMIT = 1 << 16


def _only(options: Mapping[str, Any], allowed: set[str]) -> None:
    for key in options:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise CheckOptionError(str(key), f"unknown option (allowed: {known})")


def _str(options: Mapping[str, Any], key: str, default: str | None = None,
         required: bool = False) -> str | None:
    value = options.get(key)
    if value is None:
        if required:
            raise CheckOptionError(key, "is required")
        return default
    if not isinstance(value, str) or not value:
        raise CheckOptionError(key, "must be a non-empty string")
    return value


def _int(value: Any, key: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckOptionError(key, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise CheckOptionError(key, f"must be between {lo} and {hi}" if hi is not None
                               else f"must be >= {lo}, got {value}")
    return value


def _str_map(options: Mapping[str, Any], key: str) -> dict[str, str]:
    value = options.get(key) or {}
    if not isinstance(value, Mapping):
        raise CheckOptionError(key, "must be a mapping of strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, str | int | float):
            raise CheckOptionError(f"{key}.{k}", "must be a string or number")
        out[k] = str(v)
    return out


def _bounded(text: str, limit: int = DETAIL_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error(exc: BaseException) -> str:
    return _bounded(f"{type(exc).__name__}: {exc}".rstrip(": "))


class HttpCheck:
    """An HTTP request whose status (and optionally body) says healthy."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        _only(options, {"url", "method", "expect_status", "body_contains", "headers"})
        url = _str(options, "url", required=True)
        assert url is not None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CheckOptionError("url", "must be an http:// or https:// URL with a host")
        self.url = url
        self.method = (_str(options, "method", "GET") or "GET").upper()
        if self.method not in HTTP_METHODS:
            raise CheckOptionError("method", f"must be one of {', '.join(HTTP_METHODS)}")
        raw = options.get("expect_status")
        statuses = [] if raw is None else raw if isinstance(raw, list) else [raw]
        if isinstance(raw, list) and not raw:
            raise CheckOptionError("expect_status", "must be a status code or a non-empty list")
        self.expect = frozenset(_int(s, "expect_status", 100, 599) for s in statuses)
        self.body_contains = _str(options, "body_contains")
        self.headers = _str_map(options, "headers")

    def _status_ok(self, status: int) -> bool:
        return status in self.expect if self.expect else 200 <= status < 400

    async def probe(self, ctx: CheckContext) -> CheckResult:
        """One request; redirects are not followed (a 3xx is the answer)."""
        timeout = aiohttp.ClientTimeout(total=HTTP_CLIENT_TIMEOUT)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
                    self.method, self.url, headers=self.headers,
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
        _only(options, {"host", "port"})
        self.host = _str(options, "host", "127.0.0.1") or "127.0.0.1"
        if options.get("port") is None:
            raise CheckOptionError("port", "is required")
        self.port = _int(options["port"], "port", 1, 65535)

    async def probe(self, ctx: CheckContext) -> CheckResult:
        """Connect and close."""
        try:
            _, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            return CheckResult(False, _error(exc))
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return CheckResult(True, f"connected to {self.host}:{self.port}")


class ExecCheck:
    """A command (argv, never a shell) in its own session; exit 0 is healthy.

    Its environment is built like the workload's: the agent's own, then the instance's
    (``ctx.env``), then the ``env`` option; ``cwd`` defaults to the agent's working directory.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        _only(options, {"command", "env", "cwd"})
        argv = options.get("command")
        if isinstance(argv, str) or not isinstance(argv, list) or not argv:
            raise CheckOptionError("command",
                                   "must be a non-empty list of strings (argv, no shell)")
        for i, item in enumerate(argv):
            if not isinstance(item, str) or not item:
                raise CheckOptionError(f"command[{i}]", "must be a non-empty string")
        self.argv: list[str] = list(argv)
        self.env = _str_map(options, "env")
        self.cwd = _str(options, "cwd")

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
        _only(options, {"max_rss_mib"})
        raw = options.get("max_rss_mib")
        self.max_rss_mib = None if raw is None else _int(raw, "max_rss_mib", 1)

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
    """The workload reported progress (SDK heartbeat, or any touch of the file) recently."""

    def __init__(self, options: Mapping[str, Any],
                 clock: Callable[[], float] = time.time) -> None:
        _only(options, {"stall_after", "file"})
        stall = options.get("stall_after")
        if stall is None:
            raise CheckOptionError("stall_after", "is required (seconds without progress)")
        if (isinstance(stall, bool) or not isinstance(stall, int | float)
                or not math.isfinite(stall) or stall <= 0):
            raise CheckOptionError("stall_after", f"must be a number > 0, got {stall!r}")
        self.stall_after = float(stall)
        self.file = _str(options, "file")
        self.clock = clock

    def path(self, ctx: CheckContext) -> Path:
        """The heartbeat file: ``file`` (relative to the checkpoint dir) or heartbeat.json.

        Its content is read as an SDK heartbeat; if it is not one, its mtime is the progress.
        """
        return ctx.checkpoint_dir / (self.file or "heartbeat.json")

    def probe(self, ctx: CheckContext) -> CheckResult:
        """Compare the newest progress (never before the instance started) with now."""
        now = self.clock()
        last: float | None = None
        step = "no heartbeat yet"
        path = self.path(ctx)
        try:
            with path.open(errors="replace") as f:
                beat = parse_heartbeat(f.read(HEARTBEAT_READ_LIMIT))
            if beat is not None:
                last, step = beat.t, f"last step {beat.step}"
            else:
                last, step = path.stat().st_mtime, "last step unknown"
        except FileNotFoundError:
            pass
        except OSError as exc:
            return CheckResult(False, f"cannot read {path}: {_error(exc)}")
        floor = ctx.started_at if ctx.started_at is not None else now
        progress = max(last, floor) if last is not None else floor
        age = now - progress
        if age > self.stall_after:
            return CheckResult(False, f"no progress for {age:.0f}s ({step})")
        return CheckResult(True, f"progress {max(age, 0.0):.0f}s ago ({step})")

