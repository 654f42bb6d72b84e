"""Contained probes, per-instance check loops, and the check type registry (entry points)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from hafo.checks import registry, runner
from hafo.checks.api import CheckContext, CheckOptionError, CheckResult
from hafo.checks.builtin import ExecCheck, HttpCheck
from hafo.checks.registry import (
    CheckLoadError,
    UnknownCheckType,
    available_types,
    clear_cache,
    load_check,
)
from hafo.checks.runner import InstanceChecks, run_probe
from hafo.model.spec import CheckSpec

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def ctx(tmp_path: Path) -> CheckContext:
    return CheckContext(workload="w", node="n1", epoch=7, pid=None, started_at=None,
                        checkpoint_dir=tmp_path)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at teardown so that hung sync probes (daemon threads) end."""
    event = threading.Event()
    yield event
    event.set()


class Probe:
    """A check whose probe is ``fn``, counting its calls."""

    def __init__(self, fn: Callable[[CheckContext], Any]) -> None:
        self.fn = fn
        self.calls = 0

    def probe(self, ctx: CheckContext) -> Any:
        self.calls += 1
        return self.fn(ctx)


class AsyncProbe(Probe):
    """Like Probe, with an async probe around an async ``fn``."""

    async def probe(self, ctx: CheckContext) -> Any:
        self.calls += 1
        return await self.fn(ctx)


async def forever(_: CheckContext) -> CheckResult:
    await asyncio.sleep(30)
    return CheckResult(True)


def boom(_: CheckContext) -> CheckResult:
    raise ValueError("bad value")


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# --- run_probe ------------------------------------------------------------------------------

@pytest.mark.parametrize(("check", "expected"), [
    pytest.param(Probe(lambda c: True), CheckResult(True, ""), id="sync-true"),
    pytest.param(Probe(lambda c: False), CheckResult(False, "probe returned False"),
                 id="sync-false"),
    pytest.param(Probe(lambda c: CheckResult(True, "fine\nreally")),
                 CheckResult(True, "fine really"), id="sync-result-one-line"),
    pytest.param(Probe(boom), CheckResult(False, "raised ValueError: bad value"), id="raises"),
    pytest.param(Probe(lambda c: sys.exit(3)), CheckResult(False, "raised SystemExit: 3"),
                 id="sys-exit"),
    pytest.param(Probe(lambda c: 42), CheckResult(False, "returned garbage: 42"), id="garbage"),
    pytest.param(Probe(lambda c: CheckResult("yes", "x")),  # type: ignore[arg-type]
                 CheckResult(False, "returned garbage: CheckResult(ok='yes', detail='x')"),
                 id="result-with-non-bool-ok"),
    pytest.param(Probe(lambda c: asyncio.sleep(0, True)), CheckResult(True, ""),
                 id="sync-returning-coroutine"),
    pytest.param(AsyncProbe(lambda c: asyncio.sleep(0, CheckResult(False, "down"))),
                 CheckResult(False, "down"), id="async-result"),
    pytest.param(AsyncProbe(lambda c: asyncio.sleep(0, None)),
                 CheckResult(False, "returned garbage: None"), id="async-garbage"),
])
async def test_run_probe_converts(ctx: CheckContext, check: Probe,
                                  expected: CheckResult) -> None:
    assert await run_probe(check, ctx, 2) == expected


async def test_garbage_repr_is_bounded_and_broken_repr_survives(ctx: CheckContext) -> None:
    long = await run_probe(Probe(lambda c: "x" * 1000), ctx, 2)
    assert not long.ok and len(long.detail) <= len("returned garbage: ") + 80

    class Nasty:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    nasty = await run_probe(Probe(lambda c: Nasty()), ctx, 2)
    assert nasty == CheckResult(False, "returned garbage: <Nasty that cannot be shown>")


async def test_wrong_signature_is_a_failure(ctx: CheckContext) -> None:
    class NoArgs:
        async def probe(self) -> bool:
            return True

    result = await run_probe(NoArgs(), ctx, 2)  # type: ignore[arg-type]
    assert not result.ok and result.detail.startswith("raised TypeError")


async def test_async_hang_times_out(ctx: CheckContext) -> None:
    started = time.monotonic()
    assert await run_probe(AsyncProbe(forever), ctx, 0.1) == CheckResult(
        False, "timed out after 0.1s")
    assert time.monotonic() - started < 1


async def test_sync_hang_keeps_one_thread(ctx: CheckContext, release: threading.Event) -> None:
    def probe_threads() -> int:
        return sum(t.name == "hafo-check-w" for t in threading.enumerate())

    check = Probe(lambda c: release.wait(20))
    threads = probe_threads()
    assert await run_probe(check, ctx, 0.1) == CheckResult(False, "timed out after 0.1s")
    again = await run_probe(check, ctx, 0.1)
    assert not again.ok and again.detail.startswith("still running since")
    assert check.calls == 1 and probe_threads() == threads + 1
    release.set()
    await wait_until(lambda: probe_threads() == threads)
    assert await run_probe(check, ctx, 0.1) == CheckResult(True, "")
    assert check.calls == 2


async def test_async_probe_ignoring_cancellation(ctx: CheckContext,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "CANCEL_GRACE", 0.05)
    done = asyncio.Event()

    async def stubborn(_: CheckContext) -> bool:
        while not done.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await done.wait()
        return True

    check = AsyncProbe(stubborn)
    assert await run_probe(check, ctx, 0.05) == CheckResult(False, "timed out after 0.05s")
    busy = await run_probe(check, ctx, 0.05)
    assert busy.detail.startswith("still running since") and check.calls == 1
    done.set()
    await wait_until(lambda: id(check) not in runner._in_flight)  # the stuck run ended
    assert await run_probe(check, ctx, 0.5) == CheckResult(True, "")


async def test_cancelling_run_probe_cancels_the_probe(ctx: CheckContext) -> None:
    entered, cleaned = asyncio.Event(), asyncio.Event()

    async def slow(_: CheckContext) -> bool:
        entered.set()
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.set()
        return True

    task = asyncio.create_task(run_probe(AsyncProbe(slow), ctx, 30))
    await asyncio.wait_for(entered.wait(), 5)  # the probe is running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()


# --- InstanceChecks -------------------------------------------------------------------------

@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> dict[str, Probe]:
    """Test check types, registered as if built in; each factory returns the same check."""
    checks = {
        "ok": Probe(lambda c: CheckResult(True, "fine")),
        "raise": Probe(boom),
        "hang-async": AsyncProbe(forever),
        "hang-sync": Probe(lambda c: release.wait(20)),
        "garbage": Probe(lambda c: {"not": "a result"}),
    }
    for name, check in checks.items():
        monkeypatch.setitem(registry.BUILTIN, f"t-{name}", factory_of(check))
    return checks


def factory_of(check: Probe) -> Callable[[Mapping[str, Any]], Probe]:
    """A factory that ignores its options and returns ``check``."""
    return lambda options: check


def spec(type: str, **kwargs: Any) -> CheckSpec:
    fields: dict[str, Any] = {"interval": 0.05, "timeout": 0.1, "failure_threshold": 2}
    return CheckSpec(type=type, **{**fields, **kwargs})


@pytest.fixture
async def stopper() -> AsyncIterator[list[InstanceChecks]]:
    started: list[InstanceChecks] = []
    yield started
    for checks in started:
        await checks.stop()


async def test_containment(ctx: CheckContext, plugins: dict[str, Probe],
                           stopper: list[InstanceChecks]) -> None:
    checks = InstanceChecks([spec("t-ok"), spec("t-raise"), spec("t-hang-async"),
                             spec("t-hang-sync"), spec("t-garbage")], ctx)
    stopper.append(checks)
    checks.start()
    await wait_until(lambda: all(r["failing"] for r in checks.results()[1:]))
    await wait_until(lambda: plugins["ok"].calls >= 8)
    ok, raises, hang_async, hang_sync, garbage = checks.results()
    assert ok == {"type": "t-ok", "index": 0, "failing": False, "consecutive_failures": 0,
                  "last_detail": "fine", "runs": ok["runs"], "passing": True}
    assert ok["runs"] >= 7  # 8 calls started, one at a time: the first 7 were observed
    assert raises["last_detail"] == "raised ValueError: bad value"
    assert hang_async["last_detail"] == "timed out after 0.1s"
    assert hang_sync["last_detail"].startswith("still running since")
    assert plugins["hang-sync"].calls == 1
    assert garbage["last_detail"] == "returned garbage: {'not': 'a result'}"
    reason = checks.failing
    assert reason is not None
    assert reason.startswith("check t-raise[1] failed ")
    assert "times in a row: raised ValueError: bad value (and 3 more failing checks)" in reason
    await checks.stop()
    calls = plugins["ok"].calls
    await asyncio.sleep(0.15)  # on purpose: three intervals in which a running loop would probe
    assert plugins["ok"].calls == calls


async def test_threshold_and_recovery(ctx: CheckContext, monkeypatch: pytest.MonkeyPatch,
                                      stopper: list[InstanceChecks]) -> None:
    script = [False, False, True, False, False, False, True]  # then passes for good
    flaky = Probe(lambda c: script.pop(0) if script else True)
    monkeypatch.setitem(registry.BUILTIN, "t-flaky", lambda options: flaky)
    seen: list[tuple[int, bool]] = []
    with capture_logs() as logs:
        checks = InstanceChecks([spec("t-flaky", failure_threshold=3)], ctx)
        stopper.append(checks)
        original = checks._observe

        def record(index: int, s: CheckSpec, result: CheckResult) -> None:
            original(index, s, result)
            seen.append((checks.results()[0]["consecutive_failures"],
                         checks.failing is not None))

        monkeypatch.setattr(checks, "_observe", record)
        checks.start()
        await wait_until(lambda: len(seen) >= 8)
    assert seen[:8] == [(1, False), (2, False), (0, False), (1, False), (2, False), (3, True),
                        (0, False), (0, False)]
    events = [(e["event"], e["workload"], e["node"], e["epoch"], e["check"]) for e in logs]
    assert events == [("check failing", "w", "n1", 7, "t-flaky[0]"),
                      ("check recovered", "w", "n1", 7, "t-flaky[0]")]


async def test_initial_delay_is_startup_grace(ctx: CheckContext, plugins: dict[str, Probe],
                                              stopper: list[InstanceChecks]) -> None:
    checks = InstanceChecks([spec("t-raise", initial_delay=0.3, failure_threshold=1)], ctx)
    stopper.append(checks)
    started = time.monotonic()
    checks.start()
    await asyncio.sleep(0.15)  # on purpose: half the initial delay, in which nothing may run
    assert plugins["raise"].calls == 0 and checks.failing is None
    await wait_until(lambda: checks.failing is not None)
    assert time.monotonic() - started >= 0.3
    assert checks.failing == ("check t-raise[0] failed 1 time in a row: "
                              "raised ValueError: bad value")


async def test_unusable_checks_fail_for_good(ctx: CheckContext, plugins: dict[str, Probe],
                                             stopper: list[InstanceChecks]) -> None:
    with capture_logs() as logs:
        checks = InstanceChecks([spec("t-ok"), spec("nope"), spec("http")], ctx)
        stopper.append(checks)
        checks.start()
    reason = checks.failing
    assert reason is not None and reason.startswith(
        "check nope[1] cannot be used: unknown check type 'nope' (available: ")
    assert reason.endswith("(and 1 more failing check)")
    _, nope, http = checks.results()
    assert nope["failing"] and http["failing"] and http["last_detail"].startswith("url: give url")
    assert [e["check"] for e in logs if e["event"] == "check cannot be used"] == [
        "nope[1]", "http[2]"]
    await wait_until(lambda: plugins["ok"].calls >= 3)
    assert checks.results()[0]["failing"] is False


async def test_stop_kills_exec_probes(ctx: CheckContext, tmp_path: Path,
                                      stopper: list[InstanceChecks]) -> None:
    pidfile = tmp_path / "pid"
    command = ["sh", "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}; "
                           "exec sleep 30"]
    checks = InstanceChecks([CheckSpec(type="exec", interval=1, timeout=30,
                                       options={"command": command})], ctx)
    stopper.append(checks)
    checks.start()
    await wait_until(pidfile.exists)
    pid = int(pidfile.read_text())
    try:
        await checks.stop()
        assert not Path(f"/proc/{pid}").exists()  # killed and reaped
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


# --- registry -------------------------------------------------------------------------------

PLUGIN = '''
from hafo.checks.api import CheckOptionError, CheckResult

class Fake:
    def __init__(self, options):
        self.options = dict(options)
    def probe(self, ctx):
        return CheckResult(True, f"fake {self.options} for {ctx.workload}")

def strict(options):
    raise CheckOptionError("level", "is required")

def crashing(options):
    return 1 / 0

def noprobe(options):
    return object()
'''

ENTRY_POINTS = """
[hafo.checks]
fake-type = hafo_fake_plugin:Fake
strict-type = hafo_fake_plugin:strict
crashing-type = hafo_fake_plugin:crashing
noprobe-type = hafo_fake_plugin:noprobe
broken-type = hafo_missing_module:Factory
http = hafo_fake_plugin:Fake
"""


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution 'hafo-fake-plugin' with check entry points, on sys.path."""
    root = tmp_path / "site"
    info = root / "hafo_fake_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hafo-fake-plugin\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (root / "hafo_fake_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    clear_cache()
    yield info
    clear_cache()
    sys.modules.pop("hafo_fake_plugin", None)


def test_builtins_resolve() -> None:
    assert isinstance(load_check("http", {"url": "http://127.0.0.1/"}), HttpCheck)
    assert isinstance(load_check("exec", {"command": ["true"]}), ExecCheck)
    types = available_types()
    assert {k: types[k] for k in registry.BUILTIN} == dict.fromkeys(registry.BUILTIN, "builtin")


def test_unknown_type_lists_available() -> None:
    with pytest.raises(UnknownCheckType) as err:
        load_check("nope", {})
    message = str(err.value)
    assert message.startswith("unknown check type 'nope' (available: ")
    for name in ("exec", "http", "process", "progress", "tcp"):
        assert name in message
    assert "hafo.checks" in message


def test_builtin_option_error_propagates() -> None:
    with pytest.raises(CheckOptionError) as err:
        load_check("tcp", {"port": 0})
    assert err.value.field == "port"


async def test_entry_point_plugin(fake_dist: Path, ctx: CheckContext) -> None:
    check = load_check("fake-type", {"level": 2})
    assert await run_probe(check, ctx, 1) == CheckResult(True, "fake {'level': 2} for w")
    assert available_types()["fake-type"] == "hafo-fake-plugin"
    (fake_dist / "entry_points.txt").write_text("")  # the loaded factory is cached
    assert load_check("fake-type", {}).probe(ctx) == CheckResult(True, "fake {} for w")
    clear_cache()
    with pytest.raises(UnknownCheckType):
        load_check("fake-type", {})


def test_entry_point_cannot_shadow_builtin(fake_dist: Path) -> None:
    with capture_logs() as logs:
        types = available_types()
        available_types()
    assert types["http"] == "builtin"
    assert [(e["event"], e["type"], e["plugin"]) for e in logs] == [
        ("check plugin ignored: a built-in type has its name", "http", "hafo-fake-plugin")]
    assert isinstance(load_check("http", {"url": "http://127.0.0.1/"}), HttpCheck)


@pytest.mark.parametrize(("type", "error", "text"), [
    pytest.param("strict-type", CheckOptionError, "level: is required", id="option-error"),
    pytest.param("crashing-type", CheckLoadError, "factory failed: ZeroDivisionError",
                 id="factory-raises"),
    pytest.param("noprobe-type", CheckLoadError, "factory returned object without a probe()",
                 id="no-probe"),
    pytest.param("broken-type", CheckLoadError, "cannot load plugin hafo-fake-plugin",
                 id="import-fails"),
])
def test_plugin_errors(fake_dist: Path, type: str, error: type[Exception], text: str) -> None:
    with pytest.raises(error) as err:
        load_check(type, {})
    assert text in str(err.value)
    if type == "broken-type":
        assert isinstance(err.value.__cause__, ModuleNotFoundError)


def test_options_are_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Mapping[str, Any]] = []

    def spy(options: Mapping[str, Any]) -> Probe:
        seen.append(options)
        return Probe(lambda c: True)

    monkeypatch.setitem(registry.BUILTIN, "t-spy", spy)
    original = {"a": 1}
    load_check("t-spy", original)
    with pytest.raises(TypeError):
        seen[0]["a"] = 2  # type: ignore[index]
    assert original == {"a": 1}
