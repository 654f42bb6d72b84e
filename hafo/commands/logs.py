"""``hafo logs``: a workload's output, read from the agent of the node where it runs.

The workload (name or id; ``--replica`` picks a service's replica, ``--rank`` a gang's
member) is looked up in etcd; its current instance's node and epoch come from its assignment,
the node's API address from its node record, and the output from that agent
(``GET /v1/workloads/{id}/logs/{epoch}``). ``-f`` follows it, through failovers and moves:
when the assignment names a new instance, what the old one still has is read first (if its
node answers), then a line ``==> output continues on NODE, epoch E <==``, then the new one's.
``--all`` asks every node for the epochs it keeps, and prints them oldest first, each under
``==> NODE, epoch E <==``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hafo.commands.base import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CliError,
    load_config,
    positive_int,
    store_args,
    with_store,
)
from hafo.stopping import stop_on_signals

if TYPE_CHECKING:
    from hafo.api.client import ApiClient, ApiResponse
    from hafo.model.cluster import ClusterSnapshot
    from hafo.model.output import OutputChunk, OutputRequest
    from hafo.model.output_view import Instance, OutputLog

#: Seconds between reads while following, and between looks at the assignment.
POLL = 0.3
RECHECK = 1.0
#: Seconds one request to an agent may take (the old instance's node: shorter).
REQUEST_TIMEOUT = 5.0
DRAIN_TIMEOUT = 2.0


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def register(sub: Any) -> None:
    """Add the ``logs`` subparser."""
    env = os.environ.get
    p = sub.add_parser("logs", help="a workload's output, from its node's agent (-f follows "
                                    "it through failovers)")
    p.add_argument("workload", help="a workload's name or id")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new output, across failovers and moves, until Ctrl-C "
                        "or the workload completes or is deleted")
    p.add_argument("--tail", type=positive_int, metavar="N",
                   help="only the last N lines (of each epoch with --all)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--epoch", type=positive_int, metavar="E",
                       help="that instance's output (whichever node keeps it)")
    which.add_argument("--all", action="store_true",
                       help="every epoch kept on any node, oldest first, each under a header")
    member = p.add_mutually_exclusive_group()
    member.add_argument("--replica", type=_whole, metavar="I",
                        help="a service's replica I (its id ends in .I; default: the first)")
    member.add_argument("--rank", type=_whole, metavar="R",
                        help="a gang's member of rank R (default 0)")
    p.add_argument("--api-token-file", default=env("HAFO_API_TOKEN_FILE"), metavar="FILE",
                   help="the agents' API token (default $HAFO_API_TOKEN_FILE, then --config's "
                        "api.token_file)")
    p.add_argument("--api-ca", default=env("HAFO_API_CA"), metavar="PEM",
                   help="CA of the agents' API certificates: talk https ($HAFO_API_CA, then "
                        "--config's api.tls_ca)")
    store_args(p)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo logs``."""
    if args.follow and args.all:
        raise CliError("hafo logs: --follow and --all do not go together (see --help)",
                       EXIT_USAGE)
    return asyncio.run(_main(args))


# -- talking to agents ----------------------------------------------------------------------


def _api_access(args: argparse.Namespace) -> tuple[str | None, Any]:
    """The bearer token and the TLS context (None: plain http) for the agents' API
    (ApiSetupError naming the flag or the config field that cannot be loaded)."""
    from hafo.api.client import load_access

    token_file, ca = args.api_token_file, args.api_ca
    field = "--api-token-file"
    if args.config and (token_file is None or ca is None):
        config = load_config(args.config, "client")
        if token_file is None and config.api.token_file:
            token_file, field = config.api.token_file, f"{args.config}: api.token_file"
        ca = ca or config.api.tls_ca
    return load_access(token_file, field, ca, "--api-ca")


@dataclass
class Agents:
    """Reads output from the agents of a cluster's nodes, through one API client. A node
    whose agent gives no usable answer raises ``ApiUnavailable``; one that refuses or
    answers an error, ``ApiRefused`` or ``ApiStatusError`` (``hafo.api.client``)."""

    client: ApiClient
    snapshot: ClusterSnapshot

    def url(self, node: str) -> str:
        """The base URL of ``node``'s agent API (from its node record)."""
        from hafo.api.client import ApiUnavailable

        record = self.snapshot.nodes.get(node)
        if record is None or not record.api:
            raise ApiUnavailable(f"{node} has no API address in its node record",
                                 f"{node}'s agent")
        host, _, port = record.api.rpartition(":")
        if host in ("", "0.0.0.0", "::", "[::]"):  # listening everywhere: its address
            host = record.address or node
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
        return f"{self.client.scheme}://{host}:{port}"

    async def _get(self, node: str, path: str, params: dict[str, str],
                   timeout: float) -> ApiResponse:
        return await self.client.get(self.url(node), path, params=params, timeout=timeout,
                                     who=f"{node}'s agent")

    async def kept(self, node: str, wid: str, timeout: float = REQUEST_TIMEOUT
                   ) -> list[OutputLog]:
        """The epochs of ``wid`` whose output ``node`` keeps."""
        from hafo.api.client import ApiBadAnswer
        from hafo.model import ValidationError
        from hafo.model.output_view import OutputLog

        answer = (await self._get(node, f"/v1/workloads/{wid}/logs", {}, timeout)
                  ).raise_for_status()
        try:
            return [OutputLog.from_dict(item)
                    for item in answer.json("listing")["epochs"]]
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            raise ApiBadAnswer(answer.who, "listing", str(exc)) from None

    async def read(self, node: str, wid: str, epoch: int, request: OutputRequest,
                   timeout: float = REQUEST_TIMEOUT) -> OutputChunk | None:
        """Output of ``wid`` at ``epoch`` on ``node`` (None: that node keeps none)."""
        from hafo.api.client import ApiBadAnswer
        from hafo.model.output import chunk_from

        params = {"limit": str(request.limit)}
        if request.tail is not None:
            params["tail"] = str(request.tail)
        elif request.offset is not None:
            params["offset"] = str(request.offset)
        answer = await self._get(node, f"/v1/workloads/{wid}/logs/{epoch}", params, timeout)
        if answer.status == 404:
            return None
        answer.raise_for_status()
        try:
            return chunk_from(wid, answer.headers, answer.body)
        except ValueError as exc:
            raise ApiBadAnswer(answer.who, "answer", str(exc)) from None


class _Stdout:
    """The output stream: the workload's bytes as they are, and hafo's own lines, each on a
    line of its own (after an output that did not end its last line)."""

    at_line_start = True

    @classmethod
    def data(cls, data: bytes) -> None:
        if data:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            cls.at_line_start = data.endswith(b"\n")

    @classmethod
    def line(cls, text: str) -> None:
        prefix = b"" if cls.at_line_start else b"\n"
        sys.stdout.buffer.write(prefix + text.encode() + b"\n")
        sys.stdout.buffer.flush()
        cls.at_line_start = True


_out, _say = _Stdout.data, _Stdout.line


def _note(line: str) -> None:
    print(f"hafo logs: {line}", file=sys.stderr, flush=True)


def _dropped(chunk: OutputChunk) -> None:
    if chunk.dropped:
        _note(f"{chunk.dropped} bytes of {chunk.node} epoch {chunk.epoch} were rotated out "
              "(node.logs.max_mib)")


async def _print_instance(agents: Agents, node: str, wid: str, epoch: int,
                          tail: int | None) -> bool:
    """Print what ``node`` keeps of an instance (the last ``tail`` lines, or all of it as it
    is now); False when the node keeps none."""
    from hafo.model.output import OutputRequest

    chunk = await agents.read(node, wid, epoch, OutputRequest(tail=tail) if tail
                              else OutputRequest(offset=0))
    if chunk is None:
        return False
    _dropped(chunk)
    _out(chunk.data)
    end = chunk.end
    while tail is None and chunk.data and chunk.next_offset < end:
        chunk = await agents.read(node, wid, epoch, OutputRequest(offset=chunk.next_offset))
        if chunk is None:
            break
        _out(chunk.data)
    return True


async def _kept_everywhere(agents: Agents, wid: str) -> tuple[list[OutputLog], list[str]]:
    """(every kept epoch of ``wid`` on any node, oldest first; why each node that did not
    answer did not)."""
    from hafo.api.client import ApiUnavailable

    nodes = sorted(agents.snapshot.nodes)
    answers = await asyncio.gather(*(agents.kept(n, wid) for n in nodes),
                                   return_exceptions=True)
    found: list[OutputLog] = []
    problems: list[str] = []
    for node, answer in zip(nodes, answers, strict=True):
        if isinstance(answer, ApiUnavailable):
            problems.append(f"{node}: {answer}")
        elif isinstance(answer, BaseException):
            raise answer
        else:
            found.extend(answer)
    return sorted(found, key=lambda o: (o.epoch, o.node)), problems


# -- picking the workload -------------------------------------------------------------------


def _pick(snapshot: ClusterSnapshot, args: argparse.Namespace) -> str:
    """The workload (or replica) id whose output is asked for."""
    from hafo.model.cluster import replica_serial
    from hafo.model.endpoints import resolve

    wid, why = resolve(snapshot, args.workload)
    if wid is None:
        raise CliError(why, EXIT_NOT_FOUND)
    submission = snapshot.workloads[wid]
    if submission.spec.is_service and submission.service is None:
        replicas = snapshot.replicas.get(wid, ())
        if args.replica is not None:
            for rid in replicas:
                if replica_serial(rid) == args.replica:
                    return rid
            raise CliError(f"--replica: {wid} has no replica {args.replica} (replicas: "
                           f"{', '.join(replicas) or 'none yet'})", EXIT_NOT_FOUND)
        if not replicas:
            raise CliError(f"{wid} has no replica yet", EXIT_NOT_FOUND)
        if len(replicas) > 1:
            _note(f"{wid} is a service; showing replica {replicas[0]} (replicas: "
                  f"{', '.join(replicas)}; choose with --replica I)")
        return replicas[0]
    if args.replica is not None:
        raise CliError(f"--replica: {wid} is not a service", EXIT_USAGE)
    assignment = snapshot.assignments.get(wid)
    if args.rank is not None and not (assignment is not None and assignment.is_gang):
        raise CliError(f"--rank: {wid} is not a gang", EXIT_USAGE)
    return wid


# -- the modes ------------------------------------------------------------------------------


async def _main(args: argparse.Namespace) -> int:
    """Run the mode; a failed call to an agent that nothing handled becomes the CLI's one
    error (``hafo.api.client.cli_error``: unavailable 3, refused 5, other answers 1)."""
    from hafo.api.client import ApiError, cli_error

    try:
        return await _modes(args)
    except ApiError as exc:
        raise cli_error(exc) from None


async def _modes(args: argparse.Namespace) -> int:
    from hafo.api.client import ApiClient
    from hafo.store import read_snapshot

    token, tls = _api_access(args)

    async def body(store: Any, keys: Any) -> int:
        snapshot = await read_snapshot(store, keys)
        wid = _pick(snapshot, args)
        async with ApiClient(token, tls, timeout=REQUEST_TIMEOUT) as client:
            agents = Agents(client, snapshot)
            if args.all:
                return await _show_all(agents, wid, args.tail)
            if args.epoch is not None:
                return await _show_epoch(agents, wid, args.epoch, args.tail, args.follow)
            if args.follow:
                return await _follow(store, keys, agents, wid, args.rank or 0, args.tail)
            return await _show_current(agents, wid, args.rank or 0, args.tail)

    return await with_store(args, body)


async def _show_all(agents: Agents, wid: str, tail: int | None) -> int:
    from hafo.api.client import ApiUnavailable

    found, problems = await _kept_everywhere(agents, wid)
    for problem in problems:
        _note(f"skipped {problem}")
    for log in found:
        _say(f"==> {log.node}, epoch {log.epoch}{' (running)' if log.running else ''} <==")
        try:
            await _print_instance(agents, log.node, wid, log.epoch, tail)
        except ApiUnavailable as exc:
            _note(str(exc))
    if not found:
        _note(f"no node keeps output of {wid}"
              + (f" ({len(problems)} did not answer)" if problems else ""))
    return 0


async def _show_epoch(agents: Agents, wid: str, epoch: int, tail: int | None,
                      follow: bool) -> int:
    found, problems = await _kept_everywhere(agents, wid)
    holders = [log for log in found if log.epoch == epoch]
    if not holders:
        extra = f"; not answering: {'; '.join(problems)}" if problems else ""
        raise CliError(f"no node keeps output of {wid} epoch {epoch}{extra}", EXIT_NOT_FOUND)
    if not follow:
        for log in holders:
            if len(holders) > 1:  # a gang: one per member
                _say(f"==> {log.node}, epoch {log.epoch} <==")
            await _print_instance(agents, log.node, wid, epoch, tail)
        return 0
    with stop_on_signals() as stop:
        reader = _Reader(agents, wid, holders[0].node, epoch, tail)
        while not stop.is_set():
            chunk = await reader.step(quiet=False)
            if chunk is not None and not chunk.running and not chunk.data:
                return 0
            await _pause(stop, POLL)
    return 0


async def _show_current(agents: Agents, wid: str, rank: int, tail: int | None) -> int:
    from hafo.model.output_view import current_instance

    instance = current_instance(agents.snapshot, wid, rank)
    if instance.node is not None:  # no answer from its node: exit 3 (see _main)
        if await _print_instance(agents, instance.node, wid, instance.epoch, tail):
            return 0
        _note(f"{instance.node} has no output of {wid} epoch {instance.epoch} yet")
        return 0
    found, problems = await _kept_everywhere(agents, wid)
    if not found:
        extra = f"; not answering: {'; '.join(problems)}" if problems else ""
        raise CliError(f"{instance.why}; no node keeps its output{extra}")
    last = found[-1]
    _note(f"{instance.why}; its last output: {last.node}, epoch {last.epoch}")
    await _print_instance(agents, last.node, wid, last.epoch, tail)
    return 0


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class _Reader:
    """Follows one instance by offset."""

    def __init__(self, agents: Agents, wid: str, node: str, epoch: int,
                 tail: int | None) -> None:
        self.agents, self.wid, self.node, self.epoch = agents, wid, node, epoch
        self.tail = tail
        self.offset: int | None = None
        self.failing = ""

    async def step(self, quiet: bool, timeout: float = REQUEST_TIMEOUT) -> OutputChunk | None:
        """Print what is new; the answer (None: nothing kept yet, or no answer)."""
        from hafo.api.client import ApiUnavailable
        from hafo.model.output import OutputRequest

        request = (OutputRequest(tail=self.tail) if self.offset is None and self.tail
                   else OutputRequest(offset=self.offset or 0))
        try:
            chunk = await self.agents.read(self.node, self.wid, self.epoch, request, timeout)
        except ApiUnavailable as exc:
            if not quiet and str(exc) != self.failing:
                _note(f"{exc}; trying again")
            self.failing = str(exc)
            return None
        self.failing = ""
        if chunk is None:
            return None
        if self.offset is None:
            _dropped(chunk)
        self.offset = chunk.next_offset
        _out(chunk.data)
        return chunk

    async def drain(self) -> None:
        """Print what the instance still has (briefly: its node may be gone)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT * 2
        while time.monotonic() < deadline:
            chunk = await self.step(quiet=True, timeout=DRAIN_TIMEOUT)
            if chunk is None or not chunk.data:
                return


async def _follow(store: Any, keys: Any, agents: Agents, wid: str, rank: int,
                  tail: int | None) -> int:
    with stop_on_signals() as stop:
        return await _follow_until(stop, store, keys, agents, wid, rank, tail)


async def _follow_until(stop: asyncio.Event, store: Any, keys: Any, agents: Agents, wid: str,
                        rank: int, tail: int | None) -> int:
    from hafo.model.output_view import current_instance
    from hafo.store import TRANSIENT, read_snapshot

    reader: _Reader | None = None
    instance: Instance = current_instance(agents.snapshot, wid, rank)
    told = ""
    checked = time.monotonic()
    while not stop.is_set():
        if instance.node is not None and (reader is None or (reader.node, reader.epoch)
                                          != (instance.node, instance.epoch)):
            if reader is not None:
                await reader.drain()
                _say(f"==> output continues on {instance.node}, epoch {instance.epoch} <==")
                tail = None  # a new instance: from its first byte
            reader = _Reader(agents, wid, instance.node, instance.epoch, tail)
            told = ""
        if instance.final:
            if reader is not None:
                await reader.drain()
            _say(f"==> {instance.why} <==")
            return 0
        if instance.node is None and instance.why != told:
            _note(f"{instance.why}; waiting")
            told = instance.why
        if reader is not None:
            await reader.step(quiet=False)
        await _pause(stop, POLL)
        if time.monotonic() - checked >= RECHECK:
            checked = time.monotonic()
            try:
                agents.snapshot = await read_snapshot(store, keys)
            except TRANSIENT:
                if told != "etcd":
                    _note("cannot reach etcd; following the same instance")
                    told = "etcd"
                continue
            instance = current_instance(agents.snapshot, wid, rank)
    return 0
