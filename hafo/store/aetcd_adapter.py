"""Every use of aetcd beyond its documented API, in one module.

aetcd (``aetcd.Client``) covers get/put/delete, leases one at a time and prefix watches. hafo
needs more, and reaches into aetcd for it here, nowhere else:

- ``SecureClient`` re-implements ``Client.connect`` over a TLS channel (aetcd only opens
  plaintext ones). It sets the attributes ``connect`` sets (``channel``, ``metadata``, the
  ``*stub`` objects, ``_watcher``, ``_connected``) and reads the constructor's private
  ``_host``, ``_port``, ``_options``, ``_username``, ``_password``, ``_timeout``; it wraps
  ``connect`` in ``aetcd.client._handle_errors`` so errors map to aetcd's exceptions.
- ``require_leader`` adds ``hasleader: true`` to the private watcher's ``_metadata``: a watch
  on a member cut off from the raft leader then fails instead of stalling (etcd's
  ``WithRequireLeader``).
- The raw gRPC calls (``kvstub.Range`` with a limit and descending sort, ``kvstub.Txn`` with
  reads, ``leasestub.LeaseKeepAlive`` for many leases on one stream, ``leasestub.
  LeaseLeases``, ``maintenancestub.Status`` and ``clusterstub.MemberList``) use the
  connected stubs and ``metadata`` (the auth token); ``txn`` builds its operations with the
  private ``Client._ops_to_requests``.
- ``mapped_errors`` turns a raw ``AioRpcError`` into aetcd's exception types with the
  private ``aetcd.exceptions._handle_exception``, as aetcd's own methods do.

An aetcd upgrade must keep these; ``tests/integration/test_store.py`` exercises each of them
against a real etcd (TLS and authentication in ``tests/integration/test_etcd_security.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aetcd
from aetcd import exceptions as etcd_errors
from aetcd import rpc, utils, watcher
from aetcd.client import _handle_errors

from hafo.store.records import KV, Compare, Delete, Get, Put, TxnResult
from hafo.store.tls import TlsFiles

T = TypeVar("T")
Client = aetcd.Client


class SecureClient(aetcd.Client):  # type: ignore[misc]
    """``aetcd.Client`` over a TLS channel (same API, same authentication)."""

    def __init__(self, *args: Any, tls: TlsFiles, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tls = tls

    @_handle_errors  # type: ignore[untyped-decorator,misc,unused-ignore]
    async def connect(self) -> None:
        """Open the TLS channel and authenticate (mirrors ``aetcd.Client.connect``)."""
        if self._connected.is_set():
            return
        self.channel = rpc.secure_channel(f"{self._host}:{self._port}",
                                          self._tls.credentials(),
                                          options=self._options.items())
        if self._username is not None and self._password is not None:
            self.auth_stub = rpc.AuthStub(self.channel)
            reply = await self.auth_stub.Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password),
                timeout=self._timeout)
            self.metadata = (("token", reply.token),)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                        metadata=self.metadata)
        self._connected.set()


def new_client(host: str, port: int, timeout: float, *, tls: TlsFiles | None,
               username: str | None, password: str | None,
               options: dict[str, int]) -> aetcd.Client:
    """A client for one endpoint (plaintext or TLS), not yet connected."""
    if tls is not None:
        return SecureClient(host=host, port=port, timeout=timeout, tls=tls,
                            username=username, password=password, options=options)
    return aetcd.Client(host=host, port=port, timeout=timeout, username=username,
                        password=password, options=options)


def require_leader(client: aetcd.Client) -> None:
    """Make the client's watches fail on a member without a raft leader (see the module)."""
    found = getattr(client, "_watcher", None)
    if found is not None:
        found._metadata = (*(found._metadata or ()), ("hasleader", "true"))


def to_kv(raw: Any) -> KV:
    """aetcd's (or a raw gRPC) key-value as ``KV``."""
    return KV(key=raw.key.decode(), value=bytes(raw.value), create_revision=raw.create_revision,
              mod_revision=raw.mod_revision, lease=raw.lease)


def mapped_errors(op: Callable[[aetcd.Client], Awaitable[T]]
                  ) -> Callable[[aetcd.Client], Awaitable[T]]:
    """Map raw gRPC errors of direct stub calls to aetcd's exception types."""

    async def wrapped(client: aetcd.Client) -> T:
        try:
            return await op(client)
        except aetcd.rpc.AioRpcError as exc:
            etcd_errors._handle_exception(exc)
            raise  # pragma: no cover - _handle_exception always raises

    return wrapped


async def range_newest(client: aetcd.Client, prefix: str, limit: int,
                       timeout: float) -> list[KV]:
    """The ``limit`` keys under ``prefix`` that sort last, ascending."""
    request = aetcd.rpc.RangeRequest(
        key=prefix.encode(), range_end=utils.prefix_range_end(prefix.encode()),
        limit=limit, sort_order=aetcd.rpc.RangeRequest.DESCEND,
        sort_target=aetcd.rpc.RangeRequest.KEY)
    response = await client.kvstub.Range(request, timeout=timeout, metadata=client.metadata)
    return [to_kv(kv) for kv in reversed(response.kvs)]


def _compare(client: aetcd.Client, c: Compare) -> Any:
    key = c.key.encode()
    target = {"create": client.transactions.create, "mod": client.transactions.mod,
              "version": client.transactions.version, "value": client.transactions.value}[c.target]
    base = target(key)
    value = c.value
    if c.op == "==":
        return base == value
    if c.op == "!=":
        return base != value
    if c.op == "<":
        return base < value
    return base > value


def _operation(client: aetcd.Client, o: Put | Delete | Get) -> Any:
    if isinstance(o, Put):
        return client.transactions.put(o.key.encode(), o.value, lease=o.lease)
    if isinstance(o, Delete):
        if o.prefix:
            return client.transactions.delete(o.key.encode(),
                                              range_end=utils.prefix_range_end(o.key.encode()))
        return client.transactions.delete(o.key.encode())
    return client.transactions.get(o.key.encode())


async def txn(client: aetcd.Client, compares: Sequence[Compare],
              success: Sequence[Put | Delete | Get], failure: Sequence[Put | Delete | Get],
              timeout: float) -> TxnResult:
    """One etcd transaction, with the values its ``Get`` operations read."""
    conds = [_compare(client, c) for c in compares]
    request = aetcd.rpc.TxnRequest(
        compare=[c.build_message() for c in conds],
        success=client._ops_to_requests([_operation(client, o) for o in success]),
        failure=client._ops_to_requests([_operation(client, o) for o in failure]))
    response = await client.kvstub.Txn(request, timeout=timeout, metadata=client.metadata)
    reads: list[KV | None] = []
    for item in response.responses:
        if item.WhichOneof("response") == "response_range":
            kvs = item.response_range.kvs
            reads.append(to_kv(kvs[0]) if kvs else None)
    return TxnResult(response.succeeded, response.header.revision, tuple(reads))


async def keepalive_stream(client: aetcd.Client, lease_ids: Sequence[int],
                           timeout: float) -> dict[int, int]:
    """Keepalives for many leases over one LeaseKeepAlive stream: id -> granted TTL."""
    wanted = list(lease_ids)
    requests = (aetcd.rpc.LeaseKeepAliveRequest(ID=i) for i in wanted)
    replies: dict[int, int] = {}
    stream = client.leasestub.LeaseKeepAlive(requests, timeout=timeout,
                                             metadata=client.metadata)
    async for reply in stream:
        replies[int(reply.ID)] = int(reply.TTL)
        if len(replies) == len(wanted):
            stream.cancel()
            break
    return replies


async def lease_ids(client: aetcd.Client, timeout: float) -> set[int]:
    """Every lease etcd has (one LeaseLeases call)."""
    reply = await client.leasestub.LeaseLeases(aetcd.rpc.LeaseLeasesRequest(), timeout=timeout,
                                               metadata=client.metadata)
    return {int(item.ID) for item in reply.leases}


async def member_status(client: aetcd.Client, timeout: float) -> tuple[int, int, int]:
    """(member id, leader id as it sees it (0: none), cluster size) of the connected member."""
    status = await client.maintenancestub.Status(aetcd.rpc.StatusRequest(), timeout=timeout,
                                                 metadata=client.metadata)
    members = await client.clusterstub.MemberList(aetcd.rpc.MemberListRequest(),
                                                  timeout=timeout, metadata=client.metadata)
    return int(status.header.member_id), int(status.leader), len(members.members)


RpcError = aetcd.rpc.AioRpcError
