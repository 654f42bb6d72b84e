"""Contained probes, and the loop that runs every check of one workload instance.

``run_probe`` never raises for a probe's sake: an exception, a hang, a wrong result type is one
failure of that check. Async probes are cancelled on timeout (an ``exec`` probe then kills its
process group); a sync probe runs in a daemon thread that cannot be stopped, so while an
earlier run of that check still hangs in its thread, the check fails without starting another.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from hafo.checks.api import Check, CheckContext, CheckResult
from hafo.checks.registry import load_check
from hafo.decisions.check_state import CheckState, next_due, observe
from hafo.model.spec import CheckSpec

log = structlog.get_logger("hafo.checks")

CANCEL_GRACE = 1.0  # seconds a cancelled async probe gets to clean up (kill its processes)
DETAIL_LIMIT = 300


@dataclass
class _Raised:
    exc: BaseException


@dataclass
class _InFlight:
    since: float  # time.monotonic() when the stuck probe started
    handle: threading.Thread | asyncio.Future[Any]

    def alive(self) -> bool:
        if isinstance(self.handle, threading.Thread):
            return self.handle.is_alive()
        return not self.handle.done() and not self.handle.get_loop().is_closed()


_TIMED_OUT = object()
_in_flight: dict[int, _InFlight] = {}  # id(check) -> its probe still running; holds the check


def _one_line(text: str, limit: int = DETAIL_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _safe(fn: Callable[[object], str], obj: object) -> str:
    try:
        return fn(obj)
    except Exception:
        return f"<{type(obj).__name__} that cannot be shown>"


def _convert(value: object) -> CheckResult:
    if isinstance(value, _Raised):
        msg = _safe(str, value.exc)
        name = type(value.exc).__name__
        return CheckResult(False, _one_line(f"raised {name}: {msg}" if msg else f"raised {name}"))
    if isinstance(value, bool):
        return CheckResult(value, "" if value else "probe returned False")
    if isinstance(value, CheckResult) and isinstance(value.ok, bool):
        return CheckResult(value.ok, _one_line(_safe(str, value.detail)))
    return CheckResult(False, f"returned garbage: {_one_line(_safe(repr, value), 80)}")


async def _guarded(call: Callable[[], object]) -> object:
    try:
        result = call()
        if inspect.isawaitable(result):
            result = await result
        return result
    except (Exception, SystemExit) as exc:
        return _Raised(exc)


async def _bounded(key: int, call: Callable[[], object], timeout: float) -> object:
    """Run ``call`` (sync returning an awaitable, or a coroutine function) as a task."""
    since = time.monotonic()
    task = asyncio.ensure_future(_guarded(call))
    try:
        await asyncio.wait({task}, timeout=max(timeout, 0.0))
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE)
        raise
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait({task}, timeout=CANCEL_GRACE)
    if not task.done():  # it ignores cancellation: keep it, fail its check until it ends
        entry = _InFlight(since, task)
        _in_flight[key] = entry
        task.add_done_callback(lambda _: _forget(key, entry))
    return _TIMED_OUT


def _forget(key: int, entry: _InFlight) -> None:
    if _in_flight.get(key) is entry:
        del _in_flight[key]


def _deliver(fut: asyncio.Future[object], key: int, thread: threading.Thread,
             outcome: object) -> None:
    entry = _in_flight.get(key)
    if entry is not None and entry.handle is thread:
        _forget(key, entry)
    if not fut.done():
        fut.set_result(outcome)


async def _threaded(key: int, probe: Callable[[CheckContext], object], ctx: CheckContext,
                    timeout: float) -> object:
    """Run a sync probe in a daemon thread; on timeout the thread is left to finish."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[object] = loop.create_future()
    context = contextvars.copy_context()

    def target() -> None:
        outcome: object
        try:
            outcome = context.run(probe, ctx)
        except BaseException as exc:
            outcome = _Raised(exc)
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop is closed
            loop.call_soon_threadsafe(_deliver, fut, key, thread, outcome)

    thread = threading.Thread(target=target, name=f"hafo-check-{ctx.workload}", daemon=True)
    started = time.monotonic()
    _in_flight[key] = _InFlight(started, thread)
    thread.start()
    await asyncio.wait({fut}, timeout=max(timeout, 0.0))
    if not fut.done():
        fut.cancel()
        return _TIMED_OUT
    outcome = fut.result()
    if inspect.isawaitable(outcome):  # a plain function that returned a coroutine
        left = timeout - (time.monotonic() - started)
        aw: Awaitable[object] = outcome
        return await _bounded(key, lambda: aw, left)
    return outcome


async def run_probe(check: Check, ctx: CheckContext, timeout: float) -> CheckResult:
    """Probe once under ``timeout`` seconds; every problem is a failed CheckResult."""
    key = id(check)
    busy = _in_flight.get(key)
    if busy is not None:
        if busy.alive():
            return CheckResult(False, f"still running since {time.monotonic() - busy.since:.1f}s"
                                      " ago (an earlier probe hung)")
        del _in_flight[key]
    try:
        probe = check.probe
        is_async = inspect.iscoroutinefunction(probe)
    except Exception as exc:
        return _convert(_Raised(exc))
    if is_async:
        outcome = await _bounded(key, lambda: probe(ctx), timeout)
    else:
        outcome = await _threaded(key, probe, ctx, timeout)
    if outcome is _TIMED_OUT:
        return CheckResult(False, f"timed out after {timeout:g}s")
    return _convert(outcome)


class InstanceChecks:
    """Every check of one workload instance, each in its own task, with its own state.

    ``clock`` must be monotonic seconds in step with ``asyncio.sleep``; ``start`` must be
    called on the running loop; ``stop`` cancels the probes (killing exec probe processes).
    """

    def __init__(self, specs: Sequence[CheckSpec], ctx: CheckContext,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[], None] | None = None) -> None:
        self.specs = tuple(specs)
        self.ctx = ctx
        self._clock = clock
        self._on_change = on_change
        self._states = [CheckState() for _ in self.specs]
        self._unusable: dict[int, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._log = log.bind(workload=ctx.workload, node=ctx.node, epoch=ctx.epoch)

    def _name(self, index: int) -> str:
        return f"{self.specs[index].type}[{index}]"

    def start(self) -> None:
        """Load every check and start its loop; a check that cannot be loaded fails for good."""
        if self._started:
            return
        self._started = True
        started_at = self._clock()
        for i, spec in enumerate(self.specs):
            try:
                check = load_check(spec.type, spec.options)
            except Exception as exc:
                self._unusable[i] = _one_line(str(exc)) or type(exc).__name__
                self._states[i] = CheckState(last_detail=self._unusable[i], failing=True)
                self._log.error("check cannot be used", check=self._name(i), error=str(exc))
                continue
            self._tasks.append(asyncio.get_running_loop().create_task(
                self._loop(i, spec, check, started_at), name=f"check-{self._name(i)}"))

    async def _loop(self, index: int, spec: CheckSpec, check: Check, started_at: float) -> None:
        last_run: float | None = None
        while True:
            due = next_due(started_at, spec.initial_delay, spec.interval, last_run)
            await asyncio.sleep(max(due - self._clock(), 0.0))  # always yields to the loop
            last_run = self._clock()
            result = await run_probe(check, self.ctx, spec.timeout)
            self._observe(index, spec, result)

    def _observe(self, index: int, spec: CheckSpec, result: CheckResult) -> None:
        before = self._states[index]
        was_ready = self.ready
        after = observe(before, result.ok, result.detail, spec.failure_threshold)
        self._states[index] = after
        if self._on_change is not None and (self.ready != was_ready
                                            or after.failing != before.failing):
            self._on_change()  # report it now, not at the next supervise cycle
        if after.failing and not before.failing:
            self._log.warning("check failing", check=self._name(index),
                              failures=after.consecutive_failures, detail=after.last_detail)
        elif before.failing and not after.failing:
            self._log.info("check recovered", check=self._name(index), detail=after.last_detail)

    @property
    def ready(self) -> bool:
        """Every readiness check's last probe passed (true with no readiness check)."""
        return all(state.runs > 0 and state.consecutive_failures == 0 and i not in self._unusable
                   for i, (spec, state) in enumerate(zip(self.specs, self._states, strict=True))
                   if spec.readiness)

    @property
    def failing(self) -> str | None:
        """None while every liveness check passes (or is below its threshold), else why not
        (a check with ``liveness: false`` only gates readiness)."""
        bad = [i for i, s in enumerate(self._states) if s.failing and self.specs[i].liveness]
        if not bad:
            return None
        i = bad[0]
        if i in self._unusable:
            reason = f"check {self._name(i)} cannot be used: {self._unusable[i]}"
        else:
            s = self._states[i]
            n = s.consecutive_failures
            reason = (f"check {self._name(i)} failed {n} time{'s' if n != 1 else ''} in a row: "
                      f"{s.last_detail or 'no detail'}")
        more = len(bad) - 1
        return reason + (f" (and {more} more failing check{'s' if more > 1 else ''})"
                         if more else "")

    def results(self) -> list[dict[str, Any]]:
        """Each check's current state, in spec order, for the API."""
        return [{"type": spec.type, "index": i, "failing": s.failing,
                 "passing": s.runs > 0 and s.consecutive_failures == 0,
                 "consecutive_failures": s.consecutive_failures, "last_detail": s.last_detail,
                 "runs": s.runs}
                for i, (spec, s) in enumerate(zip(self.specs, self._states, strict=True))]

    async def stop(self) -> None:
        """Cancel every check loop and wait for them (and their probes' clean-up)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
