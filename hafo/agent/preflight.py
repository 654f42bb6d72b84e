"""``python -m hafo.agent.preflight``: a gang member's pre-flight (docs/reference/gangs.md,
"Pre-flight"), run by its guard in place of the member's command::

    python -m hafo.agent.preflight --out PATH --timeout S --slowdown X --min-excess M \\
        --large-mib L -- CMD [ARGS...]

1. The members meet at rank 0's node: rank 0 opens a ``TCPStore`` on ``MASTER_PORT`` (the
   epoch's own port), the others connect to ``MASTER_ADDR:MASTER_PORT``; each sets
   ``preflight/joined/<rank>`` and waits until every rank's key is there, at most
   ``--timeout`` seconds from when it was ready to meet (torch imported: seconds on a busy
   node, which would else come off the others' wait). The gang's verdict on who joined is
   the first one written to ``preflight/verdict`` (``compare_set``): a member that saw every
   key writes ``[]``, one whose time ran out the ranks it missed, and every member takes the
   one that is there, so no member starts the test while another gives up. After a failed
   meeting rank 0 keeps the store open (at most ``LINGER_SECONDS``) until each member that
   joined read the verdict. A member that cannot reach rank 0 blames rank 0; rank 0 that
   cannot listen on the port (another process of its node holds it) blames no one.
2. They form a process group on that store (NCCL on the member's first visible GPU, else
   gloo; ``--timeout`` for each collective) and, after a barrier, each times a local probe
   at the same moment (a fixed matrix product on its GPU, or on one CPU core): the median
   of ``PROBE_RUNS`` runs after a warm-up. Then the gang times an all-reduce of 4 KiB
   (latency) and one of ``--large-mib`` MiB (bus bandwidth).
3. Every member's figures (``RankFigures``) are exchanged, and each member judges them
   alike (``hafo.decisions.preflight.judge``: a rank much slower than the median of the
   others), writes its report (``Preflight``, JSON) to ``--out`` atomically, and meets the
   others in a last barrier. The process group and the store are torn down, so that the
   listening socket on ``MASTER_PORT`` is closed before the command needs that port (the
   other members also wait, at most ``CLOSE_WAIT_SECONDS``, until rank 0's store closed).
4. Passed: every descriptor from 3 up is closed and the process execs the command, with the
   environment it was started with: the same pid. Failed: the exit status is
   ``EXIT_PREFLIGHT_FAILED``, the command never runs. A collective that breaks (a peer died
   in it) blames no rank: the peer whose process failed reports itself.

A missing or invalid argument or variable (``HAFO_GANG_RANK``, ``HAFO_GANG_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``; ``HAFO_NODE`` defaults to the host name) fails the
pre-flight at once, blaming the member's own rank if it is known. Every outcome ends in one
line on stderr (``hafo preflight: rank 1 of 3: passed in 2.3s (gloo): ...``), never a
traceback. torch is imported only once the arguments are read (and its C++ log is kept to
fatal errors unless ``TORCH_CPP_LOG_LEVEL`` says otherwise; the command gets the environment
unchanged).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import re
import socket
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from hafo.agent.instances import write_json_atomic
from hafo.decisions.preflight import judge, missing_text
from hafo.model.preflight import EXIT_PREFLIGHT_FAILED, Preflight, RankFigures
from hafo.model.spec import PreflightPolicy

#: The exit status when the command could not be executed (as a shell's "not found").
EXIT_NOT_FOUND = 127
#: How often the store is asked whether every member joined, in seconds.
POLL_SECONDS = 0.05
#: The longest one attempt to connect to rank 0's store lasts (torch's client keeps trying
#: within it, and may overrun it by half): the attempts end at the pre-flight's deadline.
CONNECT_TRY_SECONDS = 1.0
#: An attempt that failed faster than this did not wait for rank 0: no use trying again.
CONNECT_FAILS_FAST = 0.2
#: After a failed meeting, the longest rank 0 keeps its store open for the members that
#: joined to read the verdict.
LINGER_SECONDS = 5.0
#: After a passed pre-flight, the longest a member other than rank 0 waits for rank 0's
#: store to close (so that its command's own rendezvous does not meet the old store).
CLOSE_WAIT_SECONDS = 5.0
#: The probe: a SIZE x SIZE float32 matrix product, REPEAT times, per run (about 20-50 ms on
#: one CPU core of 50-100 GFLOPS; about 20 ms on a data-centre GPU without TF32).
CPU_SIZE, CPU_REPEAT = 512, 8
GPU_SIZE, GPU_REPEAT = 4096, 8
#: Timed runs (after warm-ups) of the probe, the small and the large all-reduce.
PROBE_WARMUP, PROBE_RUNS = 1, 5
SMALL_BYTES, SMALL_WARMUP, SMALL_RUNS = 4096, 3, 20
LARGE_WARMUP, LARGE_RUNS = 1, 3
#: The store's keys (rank 0's TCPStore; the process group's own go under ``GROUP_PREFIX``).
JOINED_KEY = "preflight/joined/"
VERDICT_KEY = "preflight/verdict"
SEEN_KEY = "preflight/verdict-seen"
GROUP_PREFIX = "preflight"

SAY = "hafo preflight"


class Failed(Exception):
    """The pre-flight failed: ``why`` (one sentence) and the ranks to blame."""

    def __init__(self, why: str, blamed: Sequence[int] = ()) -> None:
        super().__init__(why)
        self.why = why
        self.blamed = tuple(sorted(set(blamed)))


class Usage(Failed):
    """An argument is missing or invalid (``out``: the report's path, if it was given)."""

    def __init__(self, why: str, out: Path | None) -> None:
        super().__init__(why)
        self.out = out


@dataclass(frozen=True)
class Options:
    """The command line: where the report goes, the spec's ``preflight`` section, and the
    member's command."""

    out: Path
    timeout: float
    slowdown: float
    min_excess: float
    large_mib: int
    command: tuple[str, ...]


@dataclass(frozen=True)
class Member:
    """Who this process is in the gang, and where the gang meets (from the environment)."""

    rank: int
    size: int
    addr: str
    port: int
    node: str


@dataclass
class Figures:
    """What the collective test measured so far (a failed test reports what it reached)."""

    backend: str = ""
    small_latency: float | None = None
    large_bandwidth: float | None = None
    large_bytes: int = 0
    ranks: tuple[RankFigures, ...] = ()


@dataclass
class Links:
    """The store and the process group, held here alone so that dropping them closes
    them."""

    store: Any = None
    group: bool = False
    dist: Any = field(default=None, repr=False)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Usage(message, None)


#: The source location torch's C++ errors start with (``[/path/pair.cc:553] ``).
_SOURCE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def one_line(error: BaseException, limit: int = 200) -> str:
    """The first sentence of the first line of ``error``'s message (its type if it has
    none), without torch's source location, at most ``limit`` characters."""
    text = str(error).strip().splitlines()
    line = _SOURCE.sub("", text[0].strip()) if text else ""
    first, dot, rest = line.partition(". ")
    if dot and len(first) >= 20 and rest[:1].isupper():
        line = first
    line = line or type(error).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _number(raw: str | None, flag: str, default: float, low: float, out: Path | None,
            above: bool = False) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < low or (above and value == low):
        bound = f"above {low:g}" if above else f"{low:g} or more"
        raise Usage(f"{flag} {raw!r} is not a number {bound}", out)
    return value


def parse_options(argv: Sequence[str]) -> Options:
    """The options before ``--`` and the command after it; ``Usage`` names what is wrong
    (with ``--out``, if that was given, for the report)."""
    args = list(argv)
    split = args.index("--") if "--" in args else len(args)
    parser = _Parser(prog="python -m hafo.agent.preflight", add_help=False)
    for flag in ("--out", "--timeout", "--slowdown", "--min-excess", "--large-mib"):
        parser.add_argument(flag)
    given = parser.parse_args(args[:split])
    out = Path(given.out) if given.out else None
    if out is None:
        raise Usage("--out (the report's path) is missing", None)
    command = tuple(args[split + 1:])
    if not command:
        raise Usage("no command after --", out)
    defaults = PreflightPolicy()
    timeout = _number(given.timeout, "--timeout", defaults.timeout, 0.0, out, above=True)
    slowdown = _number(given.slowdown, "--slowdown", defaults.slowdown, 1.0, out, above=True)
    min_excess = _number(given.min_excess, "--min-excess", defaults.min_excess, 0.0, out)
    large = _number(given.large_mib, "--large-mib", defaults.large_mib, 1.0, out)
    if large != int(large):
        raise Usage(f"--large-mib {given.large_mib!r} is not a whole number of MiB", out)
    return Options(out=out, timeout=timeout, slowdown=slowdown, min_excess=min_excess,
                   large_mib=int(large), command=command)


def _integer(environ: Mapping[str, str], name: str, what: str, low: int,
             high: int | None, blamed: Sequence[int]) -> int:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        raise Failed(f"{name} is not set", blamed)
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        bound = f"{low} to {high}" if high is not None else f"from {low}"
        raise Failed(f"{name}={raw!r} is not {what} (an integer {bound})", blamed)
    return value


def read_member(environ: Mapping[str, str]) -> Member:
    """The member's rank, its gang's size and meeting point, and its node, from
    ``environ``; ``Failed`` names the variable that is missing or invalid (blaming the
    member's own rank once that is known)."""
    rank = _integer(environ, "HAFO_GANG_RANK", "a rank", 0, None, ())
    size = _integer(environ, "HAFO_GANG_SIZE", "a gang's size", 1, None, (rank,))
    if rank >= size:
        raise Failed(f"HAFO_GANG_RANK={rank} is not below HAFO_GANG_SIZE={size}", (rank,))
    addr = environ.get("MASTER_ADDR", "").strip()
    if not addr:
        raise Failed("MASTER_ADDR is not set", (rank,))
    port = _integer(environ, "MASTER_PORT", "a port", 1, 65535, (rank,))
    node = environ.get("HAFO_NODE", "").strip() or socket.gethostname()
    return Member(rank=rank, size=size, addr=addr, port=port, node=node)


# -- the meeting ---------------------------------------------------------------------------

def meet(member: Member, timeout: float, deadline: float) -> Any:
    """Rank 0's store (rank 0 opens it; the others connect until ``deadline``)."""
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    where = f"{member.addr}:{member.port}"
    if member.rank == 0:
        try:
            return TCPStore(member.addr, member.port, member.size, True,
                            timedelta(seconds=timeout), wait_for_workers=False)
        except RuntimeError as error:
            # no member to blame: the port is taken by another process of rank 0's node
            # (the gang's next epoch gets another port, hafo.decisions.gangs.master_port)
            raise Failed(f"rank 0 could not open the meeting point on port {member.port}: "
                         f"{one_line(error)}") from None
    # The client's own connect loop does the waiting; each try is bounded so that the
    # deadline holds (torch may overrun a try's timeout by half).
    while True:
        left = deadline - time.monotonic()
        began = time.monotonic()
        try:
            return TCPStore(member.addr, member.port, member.size, False,
                            timedelta(seconds=max(0.1, min(left, CONNECT_TRY_SECONDS))),
                            wait_for_workers=False)
        except RuntimeError as error:
            error_line = one_line(error)
        if time.monotonic() - began < CONNECT_FAILS_FAST:
            raise Failed(f"rank 0 (the meeting point, {where}) could not be reached: "
                         f"{error_line}", (0,))
        if time.monotonic() >= deadline:
            raise Failed(f"rank 0 (the meeting point, {where}) could not be reached within "
                         f"{timeout:g}s", (0,))


def wait_for_members(store: Any, member: Member, timeout: float, started: float,
                     deadline: float) -> float:
    """Join, and wait until the gang's verdict on who joined is written (this member's
    ``deadline``: ``timeout`` seconds after it was ready to meet): seconds from ``started``
    until every rank had joined; ``Failed`` blames the ranks that did not, or rank 0 if its
    store went away meanwhile (its process or node died: it cannot report itself)."""
    try:
        return _wait_for_members(store, member, timeout, started, deadline)
    except RuntimeError as error:  # torch's DistError: the store's connection broke
        if member.rank == 0:
            raise
        raise Failed(f"rank 0 (the meeting point, {member.addr}:{member.port}) was lost "
                     f"while the members met: {one_line(error)}", (0,)) from None


def _wait_for_members(store: Any, member: Member, timeout: float, started: float,
                      deadline: float) -> float:
    keys = [f"{JOINED_KEY}{rank}" for rank in range(member.size)]
    store.set(keys[member.rank], member.node)
    while True:
        if store.check([VERDICT_KEY]):
            verdict = store.get(VERDICT_KEY)
            break
        if store.check(keys):
            verdict = store.compare_set(VERDICT_KEY, "", "[]")
            break
        if time.monotonic() >= deadline:
            missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
            verdict = store.compare_set(VERDICT_KEY, "", json.dumps(missing))
            break
        time.sleep(POLL_SECONDS)
    joined = time.monotonic() - started
    store.add(SEEN_KEY, 1)
    missing = [int(rank) for rank in json.loads(bytes(verdict).decode())]
    if not missing:
        return joined
    if member.rank == 0:
        _linger(store, keys)
    raise Failed(f"{missing_text(missing)} within {timeout:g}s", missing)


def _linger(store: Any, keys: Sequence[str]) -> None:
    """Rank 0 after a failed meeting: keep the store open until every member that joined
    read the verdict, at most ``LINGER_SECONDS``."""
    until = time.monotonic() + LINGER_SECONDS
    while time.monotonic() < until:
        joined = sum(1 for key in keys if store.check([key]))
        if store.add(SEEN_KEY, 0) >= joined:
            return
        time.sleep(POLL_SECONDS)


# -- the collective test -------------------------------------------------------------------

def _backend() -> tuple[str, Any]:
    """``nccl`` and the member's first visible GPU where there is one, else ``gloo`` and the
    CPU."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        torch.cuda.set_device(0)
        return "nccl", torch.device("cuda", 0)
    return "gloo", torch.device("cpu")


def _synchronizer(device: Any) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def probe(device: Any) -> float:
    """Seconds for the local probe (a fixed matrix product: on the GPU, or on one CPU core):
    the median of ``PROBE_RUNS`` runs after ``PROBE_WARMUP``."""
    import torch

    gpu = device.type == "cuda"
    size, repeat = (GPU_SIZE, GPU_REPEAT) if gpu else (CPU_SIZE, CPU_REPEAT)
    if not gpu:
        torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(size, size, generator=generator).to(device)
    b = torch.rand(size, size, generator=generator).to(device)
    c = torch.empty(size, size, device=device)
    sync = _synchronizer(device)

    def run() -> float:
        began = time.perf_counter()
        for _ in range(repeat):
            torch.mm(a, b, out=c)
        sync()
        return time.perf_counter() - began

    for _ in range(PROBE_WARMUP):
        run()
    return statistics.median(run() for _ in range(PROBE_RUNS))


def timed_all_reduce(dist: Any, buffer: Any, warmup: int, runs: int,
                     sync: Callable[[], None]) -> float:
    """Median seconds of ``runs`` all-reduces of ``buffer`` after ``warmup``."""
    for _ in range(warmup):
        dist.all_reduce(buffer)
    sync()
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        dist.all_reduce(buffer)
        sync()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def collective_test(links: Links, member: Member, options: Options, joined: float,
                    figures: Figures) -> None:
    """Form the process group on the store in ``links``, time the probe and the
    all-reduces, and exchange every rank's figures (into ``figures``)."""
    import torch
    import torch.distributed as dist

    backend, device = _backend()
    figures.backend = backend
    links.dist = dist
    group_store = dist.PrefixStore(GROUP_PREFIX, links.store)  # type: ignore[attr-defined]
    dist.init_process_group(backend, store=group_store,
                            rank=member.rank, world_size=member.size,
                            timeout=timedelta(seconds=options.timeout))
    links.group = True
    sync = _synchronizer(device)
    barrier(links)
    compute = probe(device)
    small = torch.zeros(SMALL_BYTES // 4, dtype=torch.float32, device=device)
    figures.small_latency = timed_all_reduce(dist, small, SMALL_WARMUP, SMALL_RUNS, sync)
    large_bytes = options.large_mib * 2**20
    large = torch.zeros(large_bytes // 4, dtype=torch.float32, device=device)
    seconds = timed_all_reduce(dist, large, LARGE_WARMUP, LARGE_RUNS, sync)
    del large
    figures.large_bytes = large_bytes
    if member.size > 1 and seconds > 0:
        figures.large_bandwidth = 2 * (member.size - 1) / member.size * large_bytes / seconds
    mine = (member.rank, member.node, compute, joined)
    gathered: list[Any] = [None] * member.size
    dist.all_gather_object(gathered, mine)
    figures.ranks = tuple(sorted(
        (RankFigures(rank=int(rank), node=str(node), compute=round(float(compute), 6),
                     joined=round(float(joined), 6))
         for rank, node, compute, joined in gathered), key=lambda f: f.rank))


def barrier(links: Links) -> None:
    """A barrier of the process group (on the member's GPU with NCCL)."""
    dist = links.dist
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[0])
    else:
        dist.barrier()


def tear_down(links: Links, wait_for_rank_0: bool) -> None:
    """Destroy the process group and drop the store (rank 0's closes its listening socket).
    ``wait_for_rank_0``: a member other than rank 0 first waits, at most
    ``CLOSE_WAIT_SECONDS``, until rank 0's store closed."""
    if links.group:
        links.group = False
        with contextlib.suppress(Exception):
            links.dist.destroy_process_group()
    store, links.store = links.store, None
    if store is not None and wait_for_rank_0:
        with contextlib.suppress(Exception):
            store.set_timeout(timedelta(seconds=CLOSE_WAIT_SECONDS))
            until = time.monotonic() + CLOSE_WAIT_SECONDS
            while time.monotonic() < until:
                store.check([VERDICT_KEY])  # raises once rank 0's store is gone
                time.sleep(POLL_SECONDS)
    del store
    gc.collect()


# -- the whole -----------------------------------------------------------------------------

def run_preflight(options: Options, member: Member, started: float) -> Preflight:
    """The pre-flight of ``member``: meet, test, judge, write the report (before the last
    barrier; again if that fails) and tear down; never raises but on a bug."""
    import torch.distributed  # noqa: F401  (seconds, on a busy node: not the others' wait)

    figures = Figures()
    links = Links()
    deadline = time.monotonic() + options.timeout

    def report(passed: bool, blamed: Sequence[int] = (), why: str = "") -> Preflight:
        return Preflight(passed=passed, blamed=tuple(blamed), why=why,
                         backend=figures.backend, small_latency=figures.small_latency,
                         large_bandwidth=figures.large_bandwidth,
                         large_bytes=figures.large_bytes,
                         seconds=round(time.monotonic() - started, 3), ranks=figures.ranks)

    result: Preflight
    try:
        links.store = meet(member, options.timeout, deadline)
        joined = wait_for_members(links.store, member, options.timeout, started, deadline)
        collective_test(links, member, options, joined, figures)
        blamed, why = judge(figures.ranks, member.size, options.slowdown, options.min_excess)
        result = report(not blamed, blamed, why)
        write_report(options.out, result)
        barrier(links)
    except Failed as failure:
        result = report(False, failure.blamed, failure.why)
        write_report(options.out, result)
    except Exception as error:  # a collective broke: the peer that died reports itself
        result = report(False, (), f"the collective test failed: {one_line(error)}")
        write_report(options.out, result)
    tear_down(links, wait_for_rank_0=result.passed and member.rank != 0)
    return result


def write_report(out: Path, report: Preflight) -> None:
    """Write ``report`` to ``out`` atomically (its directory made if missing); an error is
    said on stderr, not raised (the verdict stands: the exit status says it)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, report.to_dict())
    except OSError as error:
        say(f"could not write the report {out}: {error.strerror or one_line(error)}")


def say(line: str) -> None:
    """One line on stderr."""
    print(f"{SAY}: {line}", file=sys.stderr, flush=True)


def exec_command(command: Sequence[str], environ: Mapping[str, str]) -> int:
    """Replace this process with ``command`` (its descriptors from 3 up closed); returns
    only if that failed: ``EXIT_NOT_FOUND``."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        highest = os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        highest = 65536
    os.closerange(3, highest if highest > 3 else 65536)
    try:
        os.execvpe(command[0], list(command), dict(environ))
    except OSError as error:
        say(f"could not run {command[0]!r}: {error.strerror or one_line(error)}")
    return EXIT_NOT_FOUND


def main(argv: Sequence[str] | None = None) -> int:
    """The program: the pre-flight, then the command (no return) or the exit status."""
    started = time.monotonic()
    environ = dict(os.environ)  # the command gets it unchanged
    args = sys.argv[1:] if argv is None else list(argv)
    rank: int | None = None
    size: int | None = None
    try:
        options = parse_options(args)
        member = read_member(environ)
    except Usage as failure:
        say(f"failed: {failure.why}")
        if failure.out is not None:
            write_report(failure.out, Preflight(passed=False, why=failure.why))
        return EXIT_PREFLIGHT_FAILED
    except Failed as failure:
        report = Preflight(passed=False, blamed=failure.blamed, why=failure.why)
        say(f"failed: {failure.why}")
        write_report(options.out, report)
        return EXIT_PREFLIGHT_FAILED
    rank, size = member.rank, member.size
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # before torch is imported
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = run_preflight(options, member, started)
    except Exception as error:  # an import or a bug: still one line and the report
        report = Preflight(passed=False, why=f"the pre-flight failed: {one_line(error)}",
                           seconds=round(time.monotonic() - started, 3))
        write_report(options.out, report)
    blamed = f"; blamed: {', '.join(map(str, report.blamed))}" if report.blamed else ""
    say(f"rank {rank} of {size}: {report.describe()}{blamed}")
    if not report.passed:
        return EXIT_PREFLIGHT_FAILED
    return exec_command(options.command, environ)


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The program's entry: ``main()``, then exit at once with its status, without the
    interpreter's teardown (torch's takes seconds on a busy node; the report is written and
    stderr flushed by then)."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
