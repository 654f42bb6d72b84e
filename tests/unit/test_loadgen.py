"""hafo.local.loadgen against a small aiohttp server in this process, on 127.0.0.1: what it
counts, what it counts as failed, its bounds, and its refusal of any host but this one."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

from hafo.local.loadgen import (
    LoadResult,
    NonLocalURLError,
    Sample,
    check_local_url,
    main,
    run_load,
)
from hafo.local.procs import free_port

pytestmark = pytest.mark.timeout(20)


@dataclass
class Server:
    """A test server: ``/`` names its replica, ``/fail`` answers 500 every ``fail_every``-th
    request, ``/slow`` takes a second, ``/text`` answers plain text, ``/away`` redirects off
    this machine."""

    url: str = ""
    hits: int = 0
    fail_every: int = 3

    def app(self) -> web.Application:
        async def hello(_: web.Request) -> web.Response:
            self.hits += 1
            return web.json_response({"replica": f"r{self.hits % 2}", "requests": self.hits})

        async def fail(_: web.Request) -> web.Response:
            self.hits += 1
            if self.hits % self.fail_every == 0:
                return web.Response(status=500, text="boom")
            return web.json_response({"replica": "r0"})

        async def slow(_: web.Request) -> web.Response:
            await asyncio.sleep(1.0)
            return web.json_response({"replica": "r0"})

        async def text(_: web.Request) -> web.Response:
            return web.Response(text="replica r9")

        async def away(_: web.Request) -> web.Response:
            raise web.HTTPFound("http://10.0.0.1/")

        app = web.Application()
        app.router.add_get("/", hello)
        app.router.add_get("/fail", fail)
        app.router.add_get("/slow", slow)
        app.router.add_get("/text", text)
        app.router.add_get("/away", away)
        return app


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    """The test server on an ephemeral 127.0.0.1 port."""
    srv = Server()
    runner = web.AppRunner(srv.app(), access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    srv.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield srv
    finally:
        await runner.cleanup()


async def test_counts_every_request_and_the_replica_that_answered(server: Server) -> None:
    result = await run_load(server.url + "/", concurrency=4, duration=10, max_requests=40)
    assert (result.total, result.succeeded, result.failed) == (40, 40, 0)
    assert server.hits == 40
    assert result.per_replica == {"r0": 20, "r1": 20}
    assert result.outcomes == {"200": 40}
    assert result.failures == [] and result.failed_between(0, math.inf) == []
    assert result.rps > 0
    p50, p99 = result.latency(50), result.latency(99)
    assert 0 < p50 <= p99 < 5
    assert set(result.latencies()) == {50, 90, 99}
    assert all(result.started <= s.start <= s.end <= result.ended for s in result.samples)
    assert "40 requests" in result.summary() and "r0 x20" in result.summary()


async def test_a_500_is_a_failure_with_its_time(server: Server) -> None:
    result = await run_load(server.url + "/fail", concurrency=2, duration=10, max_requests=30)
    assert result.total == 30
    assert result.failed == 10 and result.outcomes == {"200": 20, "500": 10}
    assert all(s.outcome == "500" and s.replica is None for s in result.failures)
    first = min(result.failures, key=lambda s: s.start)
    assert first in result.failed_between(first.start, first.start)
    assert result.failed_between(result.ended + 1, result.ended + 2) == []
    assert result.per_replica == {"r0": 20}  # successes only


async def test_a_refused_connection_is_a_failure_and_is_not_hammered() -> None:
    url = f"http://127.0.0.1:{free_port()}/"  # nobody listens there
    started = time.monotonic()
    result = await run_load(url, concurrency=2, duration=0.5, failure_pause=0.05)
    assert time.monotonic() - started < 1.5
    assert result.total == result.failed > 0
    assert set(result.outcomes) == {"ClientConnectorError"}
    # each worker waits failure_pause after a failure: at most ~2 x 0.5 / 0.05 requests
    assert result.total <= 2 * (0.5 / 0.05 + 2)


async def test_bounded_by_duration(server: Server) -> None:
    started = time.monotonic()
    result = await run_load(server.url + "/", concurrency=2, duration=0.4)
    elapsed = time.monotonic() - started
    assert 0.4 <= elapsed < 1.0
    assert result.total > 0 and result.failed == 0
    assert all(s.start < result.started + 0.4 for s in result.samples)


async def test_bounded_by_a_request_timeout(server: Server) -> None:
    started = time.monotonic()
    result = await run_load(server.url + "/slow", concurrency=2, duration=0.1, timeout=0.3)
    assert time.monotonic() - started < 0.9  # duration + timeout, not the handler's second
    assert result.total == result.failed == 2
    assert set(result.outcomes) <= {"TimeoutError", "ServerTimeoutError",
                                    "ConnectionTimeoutError", "SocketTimeoutError"}


async def test_stopped_by_the_event_and_paced_by_rate(server: Server) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.5, stop.set)
    started = time.monotonic()
    result = await run_load(server.url + "/", concurrency=2, duration=10, stop=stop, rate=20)
    assert time.monotonic() - started < 1.5
    assert 5 <= result.total <= 14  # ~20/s for 0.5 s


async def test_max_requests_zero_and_bodies_without_a_replica(server: Server) -> None:
    none = await run_load(server.url + "/", duration=5, max_requests=0)
    assert none.total == 0 and math.isnan(none.latency(50)) and none.rps == 0
    assert "no successful request" in none.summary()
    text = await run_load(server.url + "/text", concurrency=1, duration=5, max_requests=3)
    assert text.per_replica == {"?": 3}
    away = await run_load(server.url + "/away", concurrency=1, duration=5, max_requests=2)
    assert away.outcomes == {"302": 2}  # not followed off this machine, and not a success


@pytest.mark.parametrize("url", [
    "http://10.0.0.1:8080/", "http://192.168.1.10/", "https://example.com/",
    "http://0.0.0.0:8080/", "http://127.0.0.1.example.com/", "http://localhost@example.com/",
    "http://[2001:db8::1]:80/", "ftp://127.0.0.1/", "127.0.0.1:8080", "http:///x",
    "http://127.0.0.1:99999/",
])
async def test_refuses_anything_but_a_local_http_url(url: str) -> None:
    with pytest.raises(NonLocalURLError):
        check_local_url(url)
    with pytest.raises(NonLocalURLError):
        await run_load(url, concurrency=1, duration=1)


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/", "http://127.8.9.10/x?y=1",
                                 "http://[::1]:8080/", "http://localhost:8080/",
                                 "https://LOCALHOST/"])
def test_accepts_loopback_urls(url: str) -> None:
    assert check_local_url(url) == url


@pytest.mark.parametrize("kwargs", [{"concurrency": 0}, {"concurrency": 1.5},
                                    {"duration": -1}, {"duration": math.inf},
                                    {"timeout": 0}, {"max_requests": -1}, {"rate": 0}])
async def test_bad_bounds_are_refused(kwargs: dict[str, float]) -> None:
    args: dict[str, float] = {"concurrency": 1, "duration": 1, **kwargs}
    with pytest.raises(ValueError):
        await run_load("http://127.0.0.1:1/", **args)  # type: ignore[arg-type]


def test_failed_between_counts_requests_in_flight_in_the_window() -> None:
    result = LoadResult(url="http://127.0.0.1/", started=0.0, ended=10.0, samples=[
        Sample(1.0, 1.1, True, "200", "a"),
        Sample(2.0, 3.0, False, "ServerDisconnectedError"),
        Sample(4.0, 4.2, False, "503"),
        Sample(6.0, 6.1, False, "ClientConnectorError"),
    ])
    assert result.failed == 3 and result.total == 4
    assert [s.outcome for s in result.failed_between(2.5, 4.0)] == [
        "ServerDisconnectedError", "503"]
    assert result.failed_between(4.3, 5.9) == []
    assert result.failed_between(0, 1.5) == []
    assert result.rps == 0.4
    assert result.latency(0, ok_only=False) == pytest.approx(0.1)
    assert result.latency(100, ok_only=False) == pytest.approx(1.0)


async def test_cli_prints_a_summary_and_exits_by_failures(
        server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    # the CLI runs a loop of its own: in a thread, while this loop serves
    ok = await asyncio.to_thread(main, [server.url + "/", "-c", "2", "-d", "5", "-n", "10"])
    out = capsys.readouterr().out
    assert ok == 0 and "10 requests" in out and "0 failed" in out
    failing = await asyncio.to_thread(main, [server.url + "/fail", "-c", "1", "-n", "6"])
    assert failing == 1 and "2 failed" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["http://10.0.0.1/"], ["http://127.0.0.1/", "-c", "0"],
                                  ["http://127.0.0.1/", "--duration", "x"], []])
def test_cli_bad_arguments_exit_2_without_a_traceback(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
