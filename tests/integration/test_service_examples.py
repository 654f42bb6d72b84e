"""examples/http_service.py and examples/fake_openai.py as real processes on 127.0.0.1, started
the way hafo starts a replica (its env, its port): readiness follows the startup delay, SIGTERM
drains without dropping a request in flight, and the ``openai`` check plugin judges the fake
inference server (ok, then broken -> not ok)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hafo.checks.api import CheckContext, CheckResult
from hafo.local.loadgen import run_load
from hafo.local.procs import free_port, kill_pid, spawn

pytestmark = pytest.mark.timeout(20)
ROOT = Path(__file__).resolve().parents[2]
SERVICE = "examples/http_service.py"
FAKE_OPENAI = "examples/fake_openai.py"


class Proc:
    """A started example: its process, port, base URL and log."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        """What it printed so far."""
        return self.log.read_text() if self.log.exists() else ""

    def wait_listening(self, timeout: float = 10.0) -> None:
        """Until its port accepts a connection (it must not exit first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"exited {self.proc.returncode} before listening:\n{self.output()}")
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        pytest.fail(f"not listening on {self.port} after {timeout}s:\n{self.output()}")

    async def wait_exit(self, timeout: float) -> int:
        """Its exit status, waiting up to ``timeout`` seconds without blocking the loop."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        code = self.proc.poll()
        assert code is not None, f"still running after {timeout}s:\n{self.output()}"
        return code


Start = Callable[..., Proc]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start an example (argv after the script) with a replica's env on a free port; every
    process started is killed by pid and reaped at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def _start(script: str, *args: str, env: dict[str, str] | None = None,
               port_var: str = "PORT") -> Proc:
        port = free_port()
        log = tmp_path / f"{Path(script).stem}-{len(procs)}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", port_var: str(port),
                    "HAFO_WORKLOAD": "web-0", "HAFO_NODE": "node-a", "HAFO_EPOCH": "7",
                    **(env or {})}
        proc = spawn([sys.executable, script, "--host", "127.0.0.1", *args], log,
                     env=full_env, cwd=str(ROOT))
        procs.append(proc)
        started = Proc(proc, port, log)
        started.wait_listening()
        return started

    try:
        yield _start
    finally:
        for proc in procs:
            kill_pid(proc.pid, signal.SIGKILL)
            proc.wait(5)


async def get(url: str, timeout: float = 5.0) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of one GET on a connection of its own."""
    async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.get(url) as resp):
        return resp.status, await resp.text(), dict(resp.headers)


async def wait_status(url: str, status: int, timeout: float) -> None:
    """Until GET ``url`` answers ``status``."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        seen = (await get(url))[0]
        if seen == status:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{url} answered {seen}, not {status}, for {timeout}s")


# --- examples/http_service.py ---------------------------------------------------------------


async def test_health_is_503_while_starting_then_200(start: Start) -> None:
    svc = start(SERVICE, "--startup-delay", "1.0")
    started = time.monotonic()
    status, body, _ = await get(svc.url + "/health")
    assert (status, body.strip()) == (503, "starting")
    status, body, _ = await get(svc.url + "/")
    assert status == 503 and '"starting"' in body  # no answer before the "model" is loaded
    await wait_status(svc.url + "/health", 200, 5)
    assert time.monotonic() - started >= 0.8
    async with aiohttp.ClientSession() as session:
        answers = []
        for _ in range(2):
            async with session.get(svc.url + "/any/path") as resp:
                assert resp.status == 200
                answers.append(await resp.json())
        assert answers == [{"replica": "web-0", "node": "node-a", "epoch": 7,
                            "pid": svc.proc.pid, "requests": n, "path": "/any/path"}
                           for n in (1, 2)]
        async with session.get(svc.url + "/?sleep=6") as resp:
            assert resp.status == 400  # sleep is bounded
    assert f"serving on 127.0.0.1:{svc.port}" in svc.output() and "ready" in svc.output()


async def test_sigterm_answers_the_request_in_flight_refuses_new_ones_and_exits_0(
        start: Start) -> None:
    svc = start(SERVICE, port_var="HAFO_PORT_HTTP")
    await wait_status(svc.url + "/health", 200, 5)
    async with aiohttp.ClientSession() as session:
        async with session.get(svc.url + "/") as resp:  # leaves an idle keep-alive connection
            assert resp.status == 200
        slow = asyncio.create_task(get(svc.url + "/?sleep=1.5"))
        await asyncio.sleep(0.4)  # the slow request is being handled
        svc.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        # a new connection after SIGTERM: refused (the listening socket is closed) or 503
        try:
            status, _, _ = await get(svc.url + "/health", timeout=2)
        except aiohttp.ClientConnectorError:
            status = None
        assert status in (None, 503)
        assert svc.proc.poll() is None  # still draining: the slow request is in flight
        status, body, headers = await slow
        assert status == 200 and '"replica": "web-0"' in body
        assert headers.get("Connection", "").lower() == "close"
    assert await svc.wait_exit(5) == 0
    out = svc.output()
    assert "draining: 1 request(s) in flight" in out and "stopped after" in out


async def test_no_request_sent_before_sigterm_fails_under_keep_alive_load(
        start: Start) -> None:
    svc = start(SERVICE)
    await wait_status(svc.url + "/health", 200, 5)
    load = asyncio.create_task(run_load(svc.url + "/?sleep=0.05", concurrency=4, duration=2.0,
                                        rate=200))
    await asyncio.sleep(0.8)
    term = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    result = await load
    assert await svc.wait_exit(5) == 0
    before = [s for s in result.samples if s.start < term]
    assert len(before) > 20
    assert [s for s in before if not s.ok] == []
    # after it, only refusals: none cut off half-way
    assert {s.outcome for s in result.samples if s.start >= term and not s.ok} <= {
        "ClientConnectorError"}


async def test_drain_is_bounded_by_drain_timeout(start: Start) -> None:
    svc = start(SERVICE, "--drain-timeout", "0.5")
    await wait_status(svc.url + "/health", 200, 5)
    slow = asyncio.create_task(get(svc.url + "/?sleep=5"))
    await asyncio.sleep(0.3)
    term = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    assert await svc.wait_exit(4) == 0
    assert time.monotonic() - term < 3
    with pytest.raises(aiohttp.ClientError):  # cut off past the drain timeout
        await slow


# --- examples/fake_openai.py and the openai check plugin ------------------------------------

@pytest.fixture
def plugin() -> Any:
    """The plugin's module (plugins/hafo-check-openai), or skip where it is not installed."""
    return pytest.importorskip("hafo_check_openai")


def ctx(tmp_path: Path) -> CheckContext:
    """A probe context for a replica on this machine."""
    return CheckContext(workload="llm-0", node="node-a", epoch=1, pid=None, started_at=None,
                        checkpoint_dir=tmp_path)


async def probe(check: Any, tmp_path: Path) -> CheckResult:
    """One probe, bounded as the agent bounds it."""
    result: CheckResult = await asyncio.wait_for(check.probe(ctx(tmp_path)), timeout=5)
    return result


async def post(url: str) -> int:
    """The status of one POST."""
    async with aiohttp.ClientSession() as session, session.post(url) as resp:
        return resp.status


async def test_openai_check_passes_then_fails_when_broken(start: Start, plugin: Any,
                                                          tmp_path: Path) -> None:
    fake = start(FAKE_OPENAI, "--startup-delay", "0.5", "--model", "tiny")
    check = plugin.make_check({"base_url": fake.url + "/v1"})
    loading = await probe(check, tmp_path)
    assert not loading.ok and loading.detail.startswith("health 503")
    await wait_status(fake.url + "/health", 200, 5)
    ok = await probe(check, tmp_path)
    assert ok.ok and ok.detail == "health ok, completion ok (tiny)", ok.detail
    queue = await probe(plugin.make_check({"base_url": fake.url, "max_queue": 2}),
                        tmp_path)
    assert queue.ok and "queue 0" in queue.detail
    assert await post(fake.url + "/admin/queue?waiting=5") == 200
    queue = await probe(plugin.make_check({"base_url": fake.url, "max_queue": 2}),
                        tmp_path)
    assert (queue.ok, queue.detail) == (False, "queue 5 > max_queue 2")

    assert await post(fake.url + "/admin/break") == 200  # completions fail, health still 200
    broken = await probe(check, tmp_path)
    assert not broken.ok and broken.detail.startswith("completion returned 500")
    assert "illegal memory access" in broken.detail
    assert await post(fake.url + "/admin/fix") == 200
    assert (await probe(check, tmp_path)).ok
    assert await post(fake.url + "/admin/break?what=health") == 200
    dead = await probe(check, tmp_path)
    assert (dead.ok, dead.detail) == (False, "health 503: engine dead")

    async with aiohttp.ClientSession() as session:
        async with session.post(fake.url + "/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2}) as resp:
            assert resp.status == 200
            chat = await resp.json()
        assert chat["object"] == "chat.completion"
        assert chat["choices"][0]["message"] == {"role": "assistant", "content": "pong pong"}
        async with session.post(fake.url + "/v1/completions",
                                json={"model": "other", "prompt": "x"}) as resp:
            assert resp.status == 404 and "error" in await resp.json()
    fake.proc.send_signal(signal.SIGTERM)
    assert await fake.wait_exit(5) == 0


async def test_openai_fail_after(start: Start, plugin: Any, tmp_path: Path) -> None:
    fake = start(FAKE_OPENAI, "--fail-after", "2", port_var="HAFO_PORT_HTTP")
    await wait_status(fake.url + "/health", 200, 5)
    check = plugin.make_check({"base_url": fake.url, "model": "fake-model"})
    results = [await probe(check, tmp_path) for _ in range(3)]
    assert [r.ok for r in results] == [True, True, False], [r.detail for r in results]
    assert "--fail-after" in fake.output()
