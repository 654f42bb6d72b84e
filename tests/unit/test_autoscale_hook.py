"""The autoscale hook's runner (``hafo.controller.autoscale``) with real subprocesses: the
demand's JSON on a command's stdin, a hung command killed at the timeout (its whole process
group, nothing else), a failing one counted and logged once; an HTTP hook refused."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hafo.controller.autoscale import Autoscaler, post_url, run_command
from hafo.decisions.demand import Demand, Shape
from hafo.model.config import AutoscaleSection

DEMAND = Demand((Shape("default", None, None, 2, 8, 1),))


def script(tmp_path: Path, body: str) -> tuple[str, ...]:
    path = tmp_path / "hook.py"
    path.write_text(body)
    return (sys.executable, str(path))


async def test_a_command_gets_the_demand_on_its_stdin(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    argv = script(tmp_path, f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())\n"
                            "print('resized')\n")
    outcome = await run_command(argv, b'{"pending": []}', timeout=10)
    assert outcome.ok and outcome.detail == "resized"
    assert out.read_text() == '{"pending": []}'


async def test_a_hung_command_and_its_children_are_killed_at_the_timeout(
        tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    argv = script(tmp_path, "import os, subprocess, sys, time\n"
                            "child = subprocess.Popen([sys.executable, '-c', "
                            "'import time; time.sleep(60)'])\n"
                            f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
                            "time.sleep(60)\n")
    started = time.monotonic()
    outcome = await run_command(argv, b"{}", timeout=1.0)
    assert outcome.result == "timeout"
    assert time.monotonic() - started < 10
    for pid in map(int, pids.read_text().split()):
        for _ in range(50):  # the child is reaped by init once killed
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"process {pid} of the hook still runs")


async def test_a_failing_command_says_its_exit_code_and_stderr(tmp_path: Path) -> None:
    argv = script(tmp_path, "import sys; sys.stderr.write('quota exceeded\\n'); sys.exit(1)\n")
    outcome = await run_command(argv, b"{}", timeout=10)
    assert outcome.result == "failed"
    assert outcome.detail == "exited with code 1: quota exceeded"


async def test_a_command_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    outcome = await run_command((str(tmp_path / "missing"),), b"{}", timeout=10)
    assert outcome.result == "error" and "cannot start" in outcome.detail


async def test_a_refused_connection_is_an_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    outcome = await post_url(f"http://127.0.0.1:{port}/hook", b"{}", timeout=5)
    assert outcome.result == "error" and "cannot reach" in outcome.detail


async def test_a_url_hook_gets_the_json_posted() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    got: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.read())
        assert request.content_type == "application/json"
        return web.Response(status=500 if len(got) > 1 else 200, text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    async with TestServer(app, host="127.0.0.1") as server:
        url = str(server.make_url("/hook"))
        assert (await post_url(url, b'{"a": 1}', timeout=5)).ok
        failed = await post_url(url, b"{}", timeout=5)
    assert failed.result == "failed" and failed.detail.startswith("HTTP 500")
    assert got[0] == b'{"a": 1}'


async def test_the_autoscaler_calls_in_the_background_counts_and_logs_failures_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "calls"
    argv = script(tmp_path, f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + "
                            "'\\n'); sys.exit(1)\n")
    registry = CollectorRegistry()
    scaler = Autoscaler(AutoscaleSection(command=argv, interval=0.01), registry,
                        wall=lambda: 42.0)
    assert scaler.step(DEMAND, 0.0)
    assert not scaler.step(DEMAND, 0.0)  # one call at a time
    assert scaler.task is not None
    await scaler.task
    assert scaler.step(DEMAND, 1.0)  # failed: tried again after the interval
    await scaler.task
    calls = [json.loads(line) for line in out.read_text().splitlines()]
    assert calls[0] == {"at": 42.0, "pending": [{"count": 1, "gpu_model": None,
                                                "gpu_profile": None, "gpus_per_node": 8,
                                                "nodes": 2, "queue": "default"}],
                        "removable": []}
    assert registry.get_sample_value("hafo_autoscale_calls_total", {"result": "failed"}) == 2
    assert registry.get_sample_value("hafo_autoscale_calls_total", {"result": "ok"}) == 0
    logged = capsys.readouterr()
    assert (logged.out + logged.err).count("autoscale hook failed") == 1
    await scaler.close()


async def test_no_hook_configured_calls_nothing() -> None:
    scaler = Autoscaler(AutoscaleSection(), CollectorRegistry())
    assert not scaler.step(DEMAND, 0.0)


async def test_closing_kills_a_call_under_way(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    argv = script(tmp_path, f"import os, time; open({str(pid_file)!r}, 'w')"
                            ".write(str(os.getpid())); time.sleep(60)\n")
    scaler = Autoscaler(AutoscaleSection(command=argv, timeout=60), CollectorRegistry())
    scaler.step(DEMAND, 0.0)
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    await scaler.close()
    pid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the hook's command still runs after close")
