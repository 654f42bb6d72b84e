"""Built-in check types against real local servers, processes and files (127.0.0.1 only)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hafo.checks.api import CheckContext, CheckOptionError, CheckResult
from hafo.checks.builtin import ExecCheck, HttpCheck, ProcessCheck, ProgressCheck, TcpCheck
from hafo.checks.runner import run_probe
from hafo.model.errors import ValidationError
from hafo.model.progress import Heartbeat, encode_heartbeat
from hafo.model.spec import parse_spec

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def ctx(tmp_path: Path) -> CheckContext:
    return CheckContext(workload="w", node="n1", epoch=7, pid=None, started_at=None,
                        checkpoint_dir=tmp_path)


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2]


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# --- http -----------------------------------------------------------------------------------

@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="all good")

    async def fail(_: web.Request) -> web.Response:
        return web.Response(status=500, text="broken")

    async def moved(_: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/nowhere"})

    async def token(req: web.Request) -> web.Response:
        return web.Response(status=200 if req.headers.get("X-Token") == "s3cret" else 403)

    async def post_only(req: web.Request) -> web.Response:
        return web.Response(status=201, text=req.method)

    app = web.Application()
    app.router.add_get("/ok", ok)
    app.router.add_get("/fail", fail)
    app.router.add_get("/moved", moved)
    app.router.add_get("/token", token)
    app.router.add_post("/post", post_only)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    yield srv
    await srv.close()


@pytest.mark.parametrize(("path", "extra", "ok", "detail"), [
    pytest.param("/ok", {}, True, "status 200", id="ok"),
    pytest.param("/fail", {}, False, "status 500 (expected 2xx/3xx)", id="500"),
    pytest.param("/moved", {}, True, "status 302", id="redirect-not-followed-is-ok"),
    pytest.param("/moved", {"expect_status": 200}, False, "status 302 (expected 200)",
                 id="expect-200"),
    pytest.param("/fail", {"expect_status": [500, 503]}, True, "status 500", id="expect-list"),
    pytest.param("/ok", {"body_contains": "good"}, True, "status 200", id="body-contains"),
    pytest.param("/ok", {"body_contains": "ready"}, False, "body lacks 'ready'", id="body-lacks"),
    pytest.param("/token", {}, False, "status 403", id="no-header"),
    pytest.param("/token", {"headers": {"X-Token": "s3cret"}}, True, "status 200",
                 id="header-sent"),
    pytest.param("/post", {"method": "post", "expect_status": 201}, True, "status 201",
                 id="method"),
    pytest.param("/missing", {}, False, "status 404", id="404"),
])
async def test_http(server: TestServer, ctx: CheckContext, path: str, extra: dict[str, Any],
                    ok: bool, detail: str) -> None:
    result = await HttpCheck({"url": str(server.make_url(path)), **extra}).probe(ctx)
    assert result.ok is ok
    assert detail in result.detail


async def test_http_connection_refused(ctx: CheckContext) -> None:
    result = await HttpCheck({"url": f"http://127.0.0.1:{free_port()}/"}).probe(ctx)
    assert not result.ok
    assert "Client" in result.detail and "Error" in result.detail


async def test_http_hang_is_cut_by_the_runner_timeout(ctx: CheckContext) -> None:
    writers: list[asyncio.StreamWriter] = []

    def never_answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)

    listener = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        started = time.monotonic()
        result = await run_probe(HttpCheck({"url": f"http://127.0.0.1:{port}/"}), ctx, 0.2)
        assert result == CheckResult(False, "timed out after 0.2s")
        assert time.monotonic() - started < 2
    finally:
        for writer in writers:
            writer.close()
        listener.close()
        await listener.wait_closed()


@pytest.mark.parametrize(("cls", "options", "field"), [
    pytest.param(HttpCheck, {}, "url", id="http-no-url"),
    pytest.param(HttpCheck, {"url": "ftp://x/"}, "url", id="http-scheme"),
    pytest.param(HttpCheck, {"url": "http:///path"}, "url", id="http-no-host"),
    pytest.param(HttpCheck, {"url": "http://x", "method": "FETCH"}, "method", id="http-method"),
    pytest.param(HttpCheck, {"url": "http://x", "expect_status": 99}, "expect_status",
                 id="http-status-range"),
    pytest.param(HttpCheck, {"url": "http://x", "expect_status": "200"}, "expect_status",
                 id="http-status-string"),
    pytest.param(HttpCheck, {"url": "http://x", "expect_status": []}, "expect_status",
                 id="http-status-empty"),
    pytest.param(HttpCheck, {"url": "http://x", "headers": ["a"]}, "headers", id="http-headers"),
    pytest.param(HttpCheck, {"url": "http://x", "body_contains": 3}, "body_contains",
                 id="http-body"),
    pytest.param(HttpCheck, {"url": "http://x", "expect": 200}, "expect", id="http-unknown"),
    pytest.param(TcpCheck, {}, "port", id="tcp-no-port"),
    pytest.param(TcpCheck, {"port": 0}, "port", id="tcp-port-zero"),
    pytest.param(TcpCheck, {"port": 70000}, "port", id="tcp-port-high"),
    pytest.param(TcpCheck, {"port": "80"}, "port", id="tcp-port-string"),
    pytest.param(TcpCheck, {"port": True}, "port", id="tcp-port-bool"),
    pytest.param(TcpCheck, {"port": 80, "host": ""}, "host", id="tcp-host-empty"),
    pytest.param(ExecCheck, {}, "command", id="exec-no-command"),
    pytest.param(ExecCheck, {"command": "true"}, "command", id="exec-shell-string"),
    pytest.param(ExecCheck, {"command": ["true", 1]}, "command[1]", id="exec-argv-item"),
    pytest.param(ExecCheck, {"command": ["true"], "env": {"A": None}}, "env.A", id="exec-env"),
    pytest.param(ExecCheck, {"command": ["true"], "cwd": 3}, "cwd", id="exec-cwd"),
    pytest.param(ProcessCheck, {"max_rss_mib": 0}, "max_rss_mib", id="process-rss-zero"),
    pytest.param(ProcessCheck, {"max_rss_mib": "1G"}, "max_rss_mib", id="process-rss-str"),
    pytest.param(ProcessCheck, {"pid": 1}, "pid", id="process-unknown"),
    pytest.param(ProgressCheck, {}, "stall_after", id="progress-required"),
    pytest.param(ProgressCheck, {"stall_after": 0}, "stall_after", id="progress-zero"),
    pytest.param(ProgressCheck, {"stall_after": -1}, "stall_after", id="progress-negative"),
    pytest.param(ProgressCheck, {"stall_after": "10"}, "stall_after", id="progress-string"),
    pytest.param(ProgressCheck, {"stall_after": True}, "stall_after", id="progress-bool"),
    pytest.param(ProgressCheck, {"stall_after": 5, "file": ""}, "file", id="progress-file"),
])
def test_bad_options_name_the_option(cls: Callable[[dict[str, Any]], object],
                                     options: dict[str, Any], field: str) -> None:
    with pytest.raises(CheckOptionError) as err:
        cls(options)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


# --- tcp ------------------------------------------------------------------------------------

async def test_tcp(ctx: CheckContext) -> None:
    accepted = asyncio.Event()

    def on_connect(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        result = await TcpCheck({"port": port}).probe(ctx)
        assert result.ok, result.detail
        await asyncio.wait_for(accepted.wait(), 2)
    finally:
        listener.close()
        await listener.wait_closed()
    refused = await TcpCheck({"host": "127.0.0.1", "port": free_port()}).probe(ctx)
    assert not refused.ok
    assert "ConnectionRefusedError" in refused.detail


# --- exec -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "ok", "detail"), [
    pytest.param(["true"], True, "exit 0", id="ok"),
    pytest.param(["sh", "-c", "echo fine; echo oops >&2; exit 3"], False, "exit 3: oops",
                 id="stderr-last-line"),
    pytest.param(["sh", "-c", "echo first; echo last; exit 1"], False, "exit 1: last",
                 id="stdout-when-no-stderr"),
    pytest.param(["false"], False, "exit 1", id="no-output"),
    pytest.param(["sh", "-c", "kill -9 $$"], False, "killed by signal 9", id="signal"),
    pytest.param(["/nonexistent/hafo-check"], False, "cannot run", id="missing-binary"),
])
async def test_exec(ctx: CheckContext, argv: list[str], ok: bool, detail: str) -> None:
    result = await ExecCheck({"command": argv}).probe(ctx)
    assert result.ok is ok
    assert result.detail.startswith(detail)


async def test_exec_detail_is_bounded(ctx: CheckContext) -> None:
    result = await ExecCheck({"command": ["sh", "-c", "printf '%0500d\\n' 0 >&2; exit 2"]}
                             ).probe(ctx)
    assert not result.ok and result.detail.startswith("exit 2: 000")
    assert len(result.detail) <= 200


async def test_exec_env_and_cwd(tmp_path: Path) -> None:
    (tmp_path / "marker").write_text("")
    ctx = CheckContext(workload="w", node="n1", epoch=7, pid=None, started_at=None,
                       checkpoint_dir=tmp_path,
                       env={"BASE": "1"})  # on top of the agent's environment (PATH)
    check = ExecCheck({"command": ["sh", "-c", 'test "$BASE$EXTRA" = 1two && test -f marker'],
                       "env": {"EXTRA": "two"}, "cwd": str(tmp_path)})
    assert (await check.probe(ctx)).ok
    elsewhere = ExecCheck({"command": ["sh", "-c", "test -f marker"], "cwd": "/"})
    assert not (await elsewhere.probe(ctx)).ok


async def test_exec_timeout_kills_the_process_group(ctx: CheckContext, tmp_path: Path) -> None:
    script = (f"sleep 30 & echo $! > {tmp_path}/child; echo $$ > {tmp_path}/leader; "
              "exec sleep 30")
    pids: list[int] = []
    try:
        result = await run_probe(ExecCheck({"command": ["sh", "-c", script]}), ctx, 0.5)
        assert result == CheckResult(False, "timed out after 0.5s")
        pids = [int((tmp_path / name).read_text()) for name in ("leader", "child")]
        leader, child = pids
        assert proc_state(leader) is None  # killed and reaped: no such pid any more
        assert wait_for(lambda: proc_state(child) in (None, "Z"))  # killed with its group
    finally:
        for pid in pids:
            if proc_state(pid) not in (None, "Z"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# --- process --------------------------------------------------------------------------------

@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(5)


def test_process_states(ctx: CheckContext, child: subprocess.Popen[bytes]) -> None:
    check = ProcessCheck({})
    pctx = CheckContext(**{**ctx.__dict__, "pid": child.pid})
    assert check.probe(pctx).ok
    os.kill(child.pid, signal.SIGSTOP)
    assert wait_for(lambda: proc_state(child.pid) in ("T", "t"))
    stopped = check.probe(pctx)
    assert not stopped.ok and "is stopped (state T)" in stopped.detail
    os.kill(child.pid, signal.SIGCONT)
    assert wait_for(lambda: check.probe(pctx).ok)
    child.kill()
    assert wait_for(lambda: proc_state(child.pid) == "Z")
    zombie = check.probe(pctx)
    assert not zombie.ok and "zombie" in zombie.detail
    child.wait(5)
    gone = check.probe(pctx)
    assert gone == CheckResult(False, f"process {child.pid} is gone")


def test_process_rss_and_unknown_pid(ctx: CheckContext) -> None:
    me = CheckContext(**{**ctx.__dict__, "pid": os.getpid()})
    assert ProcessCheck({"max_rss_mib": 1_000_000}).probe(me).ok
    big = ProcessCheck({"max_rss_mib": 1}).probe(me)
    assert not big.ok and "MiB RSS (max_rss_mib 1)" in big.detail
    assert ProcessCheck({}).probe(ctx) == CheckResult(False, "no process (pid unknown)")


# --- progress -------------------------------------------------------------------------------

def beat(path: Path, t: float, step: int = 42) -> None:
    path.write_text(encode_heartbeat(Heartbeat(step=step, epoch=3, t=t, pid=1)))


class Mono:
    """An injected monotonic clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# Each step: (monotonic seconds, what the workload did before the probe: "beat N" writes a
# heartbeat of step N (its wall-clock t far off on purpose), "touch" rewrites a plain file,
# "" nothing), the expected result.
@pytest.mark.parametrize("steps", [
    pytest.param([(1000.0, "", True, "progress 0s ago (no heartbeat yet)"),
                  (1031.0, "", False, "no progress for 31s (no heartbeat yet)")],
                 id="never-beat-stalls-after-the-first-probe"),
    pytest.param([(1000.0, "beat 1", True, "progress 0s ago (last step 1)"),
                  (1020.0, "beat 2", True, "progress 0s ago (last step 2)"),
                  (1045.0, "", True, "progress 25s ago (last step 2)"),
                  (1051.0, "", False, "no progress for 31s (last step 2)"),
                  (1052.0, "beat 3", True, "progress 0s ago (last step 3)")],
                 id="heartbeats"),
    pytest.param([(1000.0, "touch", True, "progress 0s ago (last step unknown)"),
                  (1020.0, "", True, "progress 20s ago (last step unknown)"),
                  (1031.0, "", False, "no progress for 31s (last step unknown)"),
                  (1032.0, "touch", True, "progress 0s ago (last step unknown)")],
                 id="touched-file"),
])
def test_progress(ctx: CheckContext, steps: list[tuple[float, str, bool, str]]) -> None:
    path = ctx.checkpoint_dir / "heartbeat.json"
    clock = Mono()
    check = ProgressCheck({"stall_after": 30}, clock=clock)
    touches = 0
    for at, action, ok, detail in steps:
        clock.now = at
        if action.startswith("beat"):
            beat(path, t=123.0 + at * 7, step=int(action.split()[1]))  # t: any wall clock
        elif action == "touch":
            touches += 1
            path.write_text("touched" * touches)
            os.utime(path, (50.0, 50.0 + touches))
        assert check.probe(ctx) == CheckResult(ok, detail), at


# Issue 28, finding 4: the heartbeat's wall-clock time (or the file's mtime) was compared with
# the agent's wall clock: a forward step of the machine's clock right after a heartbeat was a
# stall (and a restart of the workload).
@pytest.mark.parametrize("plain_file", [False, True], ids=["heartbeat", "touched-file"])
@pytest.mark.parametrize("step", [600.0, 3600.0], ids=["10min", "1h"])
def test_a_forward_wall_clock_step_is_no_stall(ctx: CheckContext, plain_file: bool,
                                               step: float) -> None:
    path = ctx.checkpoint_dir / "heartbeat.json"
    before_the_step = time.time() - step  # written just before the clock stepped forward
    if plain_file:
        path.write_text("touched")
        os.utime(path, (before_the_step, before_the_step))
    else:
        beat(path, before_the_step, step=5)
    check = ProgressCheck({"stall_after": 30})
    started = CheckContext(**{**ctx.__dict__, "started_at": time.time() - 5})
    result = check.probe(started)
    assert result.ok, result.detail
    assert result.detail.startswith("progress 0s ago")


async def test_progress_real_clock_and_custom_file(ctx: CheckContext) -> None:
    (ctx.checkpoint_dir / "sub").mkdir()
    path = ctx.checkpoint_dir / "sub" / "beat"
    beat(path, time.time() - 100, step=7)
    check = ProgressCheck({"stall_after": 0.2, "file": "sub/beat"})
    assert (await run_probe(check, ctx, 2)).ok  # the first probe counts as progress
    await asyncio.sleep(0.3)
    result = await run_probe(check, ctx, 2)
    assert not result.ok and result.detail.endswith("(last step 7)")
    beat(path, time.time(), step=8)
    assert (await run_probe(check, ctx, 2)).ok


# --- spec validation at submit --------------------------------------------------------------

@pytest.mark.parametrize(("check", "field"), [
    pytest.param({"type": "progress"}, "spec.checks[0].stall_after", id="progress-required"),
    pytest.param({"type": "progress", "stall_after": 0}, "spec.checks[0].stall_after",
                 id="progress-zero"),
    pytest.param({"type": "progress", "stall_after": "5m"}, "spec.checks[0].stall_after",
                 id="progress-string"),
    pytest.param({"type": "progress", "stall_after": 5, "file": 3}, "spec.checks[0].file",
                 id="progress-file"),
    pytest.param({"type": "process", "max_rss_mib": 0}, "spec.checks[0].max_rss_mib",
                 id="process-rss"),
])
def test_spec_rejects_bad_builtin_options(check: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_spec({"name": "w", "command": ["x"], "checks": [check]})
    assert err.value.field == field


def test_spec_accepts_progress_and_process() -> None:
    spec = parse_spec({"name": "w", "command": ["x"], "checks": [
        {"type": "progress", "stall_after": 60, "interval": 5},
        {"type": "process"}, {"type": "process", "max_rss_mib": 4096}]})
    assert [c.options for c in spec.checks] == [{"stall_after": 60}, {}, {"max_rss_mib": 4096}]


def test_an_http_port_given_as_an_integral_float_is_that_port() -> None:
    """JSON Schema's integers include 8080.0 (the OpenAPI document says integer): accepted as
    8080, as every other integer field is; 8080.5 is refused naming the field."""
    assert HttpCheck({"port": 8080.0}).opts.port == 8080
    with pytest.raises(CheckOptionError) as err:
        HttpCheck({"port": 8080.5})
    assert err.value.field == "port"
