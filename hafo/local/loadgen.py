"""A bounded HTTP load generator for the tests and benchmarks: it only talks to this machine.

``run_load`` keeps ``concurrency`` workers each sending GET requests one after the other over
keep-alive connections, until ``duration`` seconds pass, ``max_requests`` were sent or
``stop`` is set; a request in flight then still gets its answer (within ``timeout``). Each
request is recorded (``Sample``): when it started and ended (``time.monotonic``), whether it
succeeded (a 2xx status), its status or the error's class name, and the replica that answered
when the body is a JSON object with a ``"replica"`` field (examples/http_service.py).

It shares the machine with the cluster under test, so it is kept cheap: few workers, no
parsing beyond the replica field, an optional request ``rate``, and a short pause after a
failed request so a refused port is not hammered.

    python -m hafo.local.loadgen http://127.0.0.1:8080/ --concurrency 8 --duration 10

Only http(s) URLs whose host is a loopback address (127.0.0.0/8, ::1) or ``localhost`` are
accepted: anything else raises ``NonLocalURLError``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from hafo.stats import percentile
from hafo.stopping import stop_on_signals

__all__ = ["LoadResult", "NonLocalURLError", "Sample", "check_local_url", "main", "run_load"]

#: The largest body parsed to find the replica that answered.
MAX_BODY = 64 * 1024
LOCAL_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})


class NonLocalURLError(ValueError):
    """The URL is not an http(s) URL of this machine's loopback addresses."""


def check_local_url(url: str) -> str:
    """``url`` if it is an http(s) URL of a loopback address or ``localhost``; else raise
    ``NonLocalURLError`` saying why. No name is resolved."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port  # ValueError on a bad port
    except ValueError as exc:
        raise NonLocalURLError(f"not a valid URL: {url!r} ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise NonLocalURLError(f"only http:// and https:// URLs are load-tested, got {url!r}")
    if not host:
        raise NonLocalURLError(f"the URL has no host: {url!r}")
    if host.lower() in LOCAL_NAMES:
        return url
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise NonLocalURLError(f"refusing to load {host!r}: only local addresses "
                               "(127.0.0.0/8, ::1, localhost) may be load-tested") from None
    if not address.is_loopback:
        raise NonLocalURLError(f"refusing to load {host}: not a loopback address "
                               "(only 127.0.0.0/8, ::1 and localhost may be load-tested)")
    return url


@dataclass(frozen=True, slots=True)
class Sample:
    """One request: ``start`` and ``end`` (``time.monotonic``), ``ok`` (2xx), ``outcome`` (the
    status as text, e.g. "200", or the error's class name, e.g. "ClientConnectorError") and
    the ``replica`` named by the answer's JSON body (None if it named none)."""

    start: float
    end: float
    ok: bool
    outcome: str
    replica: str | None = None

    @property
    def latency(self) -> float:
        """Seconds from sending to the end of the answer (or the error)."""
        return self.end - self.start


@dataclass
class LoadResult:
    """Every request of one run, in the order they ended, and the run's span
    (``started``, ``ended``: ``time.monotonic``)."""

    url: str
    started: float
    ended: float
    samples: list[Sample] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Requests sent (each answered or failed)."""
        return len(self.samples)

    @property
    def succeeded(self) -> int:
        """Requests answered 2xx."""
        return sum(1 for s in self.samples if s.ok)

    @property
    def failed(self) -> int:
        """Requests that errored or were not answered 2xx."""
        return self.total - self.succeeded

    @property
    def failures(self) -> list[Sample]:
        """The failed requests, each with its times and outcome."""
        return [s for s in self.samples if not s.ok]

    def failed_between(self, t0: float, t1: float) -> list[Sample]:
        """The failed requests in flight at some moment of [``t0``, ``t1``] (monotonic): those
        that started by ``t1`` and ended at or after ``t0``."""
        return [s for s in self.samples if not s.ok and s.start <= t1 and s.end >= t0]

    @property
    def duration(self) -> float:
        """Seconds the run took."""
        return max(self.ended - self.started, 0.0)

    @property
    def rps(self) -> float:
        """Requests (all of them) per second over the run."""
        return self.total / self.duration if self.duration > 0 else 0.0

    @property
    def per_replica(self) -> dict[str, int]:
        """Successful answers by the replica that gave them (unnamed ones under "?")."""
        counts = Counter(s.replica or "?" for s in self.samples if s.ok)
        return dict(sorted(counts.items()))

    @property
    def outcomes(self) -> dict[str, int]:
        """Requests by outcome: status ("200", "503") or error class name."""
        return dict(sorted(Counter(s.outcome for s in self.samples).items()))

    def latency(self, p: float, *, ok_only: bool = True) -> float:
        """The ``p``-th percentile (0-100) of the latency in seconds, of the successful
        requests (of all with ``ok_only=False``); NaN when there are none."""
        values = [s.latency for s in self.samples if s.ok or not ok_only]
        return percentile(values, p, method="linear", empty=math.nan)

    def latencies(self, ps: Sequence[float] = (50, 90, 99)) -> dict[float, float]:
        """Latency percentiles (seconds) of the successful requests, by percentile."""
        values = [s.latency for s in self.samples if s.ok]
        return {p: percentile(values, p, method="linear", empty=math.nan) for p in ps}

    def summary(self) -> str:
        """A few lines for people."""
        pct = ", ".join(f"p{p:g} {v * 1000:.1f} ms" for p, v in self.latencies().items())
        lines = [f"{self.url}: {self.total} requests in {self.duration:.2f}s "
                 f"({self.rps:.1f}/s), {self.failed} failed",
                 f"latency: {pct}" if self.succeeded else "latency: no successful request",
                 "outcomes: " + ", ".join(f"{k} x{v}" for k, v in self.outcomes.items())]
        if self.per_replica:
            lines.append("replicas: " + ", ".join(f"{k} x{v}"
                                                  for k, v in self.per_replica.items()))
        for sample in self.failures[:5]:
            lines.append(f"  failed at +{sample.start - self.started:.3f}s "
                         f"after {sample.latency * 1000:.1f} ms: {sample.outcome}")
        if self.failed > 5:
            lines.append(f"  ... and {self.failed - 5} more")
        return "\n".join(lines)


def _replica(body: bytes, content_type: str) -> str | None:
    """The ``replica`` field of a JSON object body, if any."""
    if "json" not in content_type or not body or len(body) > MAX_BODY:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    replica = data.get("replica") if isinstance(data, dict) else None
    return str(replica) if replica is not None else None


async def run_load(url: str, *, concurrency: int = 4, duration: float,
                   max_requests: int | None = None, timeout: float = 5.0,
                   stop: asyncio.Event | None = None, rate: float | None = None,
                   failure_pause: float = 0.01) -> LoadResult:
    """Load ``url`` (GET, redirects not followed) with ``concurrency`` keep-alive workers
    for ``duration`` seconds, at most ``max_requests`` requests in all, until ``stop`` is
    set, whichever comes first.

    ``timeout``: seconds per request (then it fails with "TimeoutError"); ``rate``: requests
    per second in all, at most (None: as fast as answered); ``failure_pause``: seconds a worker
    waits after a failed request. The run lasts at most about ``duration + timeout``.
    Raises ``NonLocalURLError`` for a URL not of this machine, ``ValueError`` for bad bounds.
    """
    check_local_url(url)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    if not 0 <= duration < math.inf:
        raise ValueError(f"duration must be a finite number of seconds >= 0, got {duration!r}")
    if max_requests is not None and max_requests < 0:
        raise ValueError(f"max_requests must be >= 0, got {max_requests!r}")
    if not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    if rate is not None and not 0 < rate < math.inf:
        raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
    if not 0 <= failure_pause < math.inf:
        raise ValueError(f"failure_pause must be a finite number >= 0, got {failure_pause!r}")

    started = time.monotonic()
    deadline = started + duration
    result = LoadResult(url=url, started=started, ended=started)
    left = max_requests  # requests still to send (None: unbounded)
    interval = concurrency / rate if rate else 0.0
    stoppable = stop is not None
    stop = stop if stop is not None else asyncio.Event()

    def claim() -> bool:
        """May one more request be sent now?"""
        nonlocal left
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        if left is not None:
            if left <= 0:
                return False
            left -= 1
        return True

    async def pause(seconds: float) -> None:
        """Sleep ``seconds``, cut short by ``stop`` or the deadline."""
        seconds = min(seconds, deadline - time.monotonic())
        if seconds <= 0 or stop.is_set():
            return
        if not stoppable:  # a plain sleep is cheaper
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    async def worker(session: aiohttp.ClientSession, index: int) -> None:
        if interval:  # spread the workers over one interval
            await pause(interval * index / concurrency)
        while claim():
            start = time.monotonic()
            try:
                # a redirect is not followed (it could lead off this machine): not 2xx
                async with session.get(url, allow_redirects=False) as resp:
                    body = await resp.read()  # all of it: the connection is then reused
                    status = resp.status
                    replica = _replica(body, resp.headers.get("Content-Type", ""))
                ok, outcome = 200 <= status < 300, str(status)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                ok, outcome, replica = False, type(exc).__name__, None
            end = time.monotonic()
            result.samples.append(Sample(start, end, ok, outcome, replica))
            wait = max(interval - (end - start), 0.0)
            await pause(wait if ok else max(wait, failure_pause))

    connector = aiohttp.TCPConnector(limit=concurrency, ttl_dns_cache=None)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout,
                                     auto_decompress=False) as session:
        await asyncio.gather(*(worker(session, i) for i in range(concurrency)))
    result.ended = time.monotonic()
    return result


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """The command line: load a local URL and print a summary; exit 1 if any request
    failed, 2 on bad arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m hafo.local.loadgen",
        description="Load a local HTTP URL (loopback only) and print a summary.")
    parser.add_argument("url", help="e.g. http://127.0.0.1:8080/")
    parser.add_argument("--concurrency", "-c", type=_positive_int, default=4,
                        help="workers, each one request at a time (4)")
    parser.add_argument("--duration", "-d", type=_seconds, default=10.0,
                        help="seconds to run (10)")
    parser.add_argument("--max-requests", "-n", type=_positive_int, default=None,
                        help="stop after this many requests")
    parser.add_argument("--timeout", type=_seconds, default=5.0,
                        help="seconds per request (5)")
    parser.add_argument("--rate", type=_seconds, default=None,
                        help="requests per second in all, at most (unlimited)")
    args = parser.parse_args(argv)
    try:
        check_local_url(args.url)
    except NonLocalURLError as exc:
        parser.error(str(exc))

    async def run() -> LoadResult:
        # Ctrl-C ends the run early, with its summary (the main thread only)
        with stop_on_signals((signal.SIGINT,)) as stop:
            return await run_load(args.url, concurrency=args.concurrency,
                                  duration=args.duration, max_requests=args.max_requests,
                                  timeout=args.timeout, rate=args.rate, stop=stop)

    result = asyncio.run(run())
    print(result.summary())
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
