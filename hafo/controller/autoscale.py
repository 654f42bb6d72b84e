"""The leader's autoscale hook (``autoscale`` in the controller's config; docs/reference/elastic.md,
"Elastic capacity"; docs/autoscaling.md): the I/O.

Each reconcile cycle the leader hands ``Autoscaler.step`` the demand it computed
(``hafo.decisions.demand``); when a call is due (``hafo.decisions.autoscale.due``: news, at
most once per ``interval``) the hook is called in a background task, so that it never
delays a decision:

- ``command``: the argv is started in a session of its own (its own process group), the
  demand's JSON on its stdin; exit 0 is success. At ``timeout`` the group is killed
  (SIGKILL to the group whose id is the pid of the process we started, while that process
  is ours: not yet reaped), so a hook's children go with it. Nothing else is ever signalled.
- ``url``: an HTTP POST of the JSON (``Content-Type: application/json``); a 2xx answer is
  success, anything else, a refused connection or the timeout a failure.

Every call is counted in ``hafo_autoscale_calls_total{result}``: ``ok``, ``failed`` (a
non-zero exit, an HTTP error status), ``timeout``, ``error`` (could not start the command,
could not connect). A failure is logged once per change of the demand, not at every try.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from prometheus_client import CollectorRegistry, Counter

from hafo.decisions.autoscale import HookState, after_call, due, started
from hafo.decisions.demand import Demand
from hafo.model.config import AutoscaleSection
from hafo.tasks import retrieve_outcome

log = structlog.get_logger("hafo.controller")

Result = Literal["ok", "failed", "timeout", "error"]
RESULTS: tuple[Result, ...] = ("ok", "failed", "timeout", "error")
#: How much of a hook's output is kept for the log.
OUTPUT_TAIL = 2000


@dataclass(frozen=True)
class HookOutcome:
    """How one call ended: ``result`` and, for people, ``detail`` (the exit code and the end
    of its stderr, the HTTP status, the error)."""

    result: Result
    detail: str = ""

    @property
    def ok(self) -> bool:
        """The hook took the demand."""
        return self.result == "ok"


def _tail(data: bytes | None) -> str:
    text = (data or b"").decode("utf-8", "replace").strip()
    return text[-OUTPUT_TAIL:]


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group of ``proc`` (a session leader we started, so the group's id
    is its pid), only while ``proc`` is not yet reaped: its pid, and so the group, is ours."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


async def run_command(argv: tuple[str, ...], body: bytes, timeout: float) -> HookOutcome:
    """Run the hook command with ``body`` on its stdin, for at most ``timeout`` seconds."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        return HookOutcome("error", f"cannot start {argv[0]}: {exc.strerror or exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(body), timeout)
    except TimeoutError:
        _kill_group(proc)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
        return HookOutcome("timeout", f"killed after {timeout:g} s (pid {proc.pid})")
    except BaseException:  # cancelled (the controller stops): nothing of ours left running
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        said = _tail(err) or _tail(out)
        return HookOutcome("failed", f"exited with code {proc.returncode}"
                           + (f": {said}" if said else ""))
    return HookOutcome("ok", _tail(out))


async def post_url(url: str, body: bytes, timeout: float) -> HookOutcome:
    """POST ``body`` to ``url`` (JSON), answered within ``timeout`` seconds."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.post(url, data=body,
                             headers={"Content-Type": "application/json"}) as response:
            text = (await response.text())[-OUTPUT_TAIL:]
            if 200 <= response.status < 300:
                return HookOutcome("ok", text.strip())
            return HookOutcome("failed", f"HTTP {response.status}: {text.strip()}")
    except TimeoutError:
        return HookOutcome("timeout", f"no answer from {url} in {timeout:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return HookOutcome("error", f"cannot reach {url}: {exc}")


class Autoscaler:
    """Calls the configured hook when the demand is news (see the module)."""

    def __init__(self, config: AutoscaleSection, registry: CollectorRegistry | None = None,
                 wall: Callable[[], float] = time.time) -> None:
        self.config = config
        self.wall = wall
        self.state = HookState()
        self.task: asyncio.Future[None] | None = None
        self.calls = Counter("hafo_autoscale_calls", "Calls of the autoscale hook by the "
                             "leader, by result: ok, failed (non-zero exit, HTTP error), "
                             "timeout (a command killed), error (could not start or connect)",
                             ["result"], registry=registry)
        for result in RESULTS:
            self.calls.labels(result)

    def new_term(self) -> None:
        """Leadership (re)gained: the hook is told the demand anew when there is any."""
        self.state = HookState(running=self.state.running, last_start=self.state.last_start)

    def step(self, demand: Demand, now: float) -> bool:
        """One leader cycle's ``demand`` at ``now`` (the controller's clock): start a call
        in the background if one is due; True if one was started."""
        if not self.config.enabled:
            return False
        key = demand.key
        if not due(self.state, key, now, self.config.interval):
            return False
        self.state = started(self.state, now)
        body = json.dumps(demand.to_dict(self.wall()), sort_keys=True).encode()
        self.task = asyncio.ensure_future(self._call(key, body))
        self.task.add_done_callback(retrieve_outcome)
        return True

    async def call(self, body: bytes) -> HookOutcome:
        """Call the hook once with ``body``."""
        config = self.config
        if config.command is not None:
            return await run_command(config.command, body, config.timeout)
        assert config.url is not None
        return await post_url(config.url, body, config.timeout)

    async def _call(self, key: Any, body: bytes) -> None:
        outcome = HookOutcome("error", "the call did not end")
        try:
            outcome = await self.call(body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must not stop calls for good
            outcome = HookOutcome("error", repr(exc))
        finally:
            self.calls.labels(outcome.result).inc()
            self.state, say = after_call(self.state, key, outcome.ok)
        if say:
            log.warning("autoscale hook failed", result=outcome.result, detail=outcome.detail,
                        retry_in=self.config.interval)
        elif outcome.ok:
            log.info("autoscale hook called", output=outcome.detail[-200:])

    async def close(self) -> None:
        """Stop a call under way (its command is killed)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
