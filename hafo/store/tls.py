"""TLS to etcd: aetcd only opens plaintext channels, so this client opens a secure one.

The certificate files are read once per connection (so a renewed certificate is picked up at
the next reconnect); the server's certificate is checked against ``ca``, and ``cert``/``key``
are sent when etcd asks for a client certificate (``--client-cert-auth``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher
from aetcd.client import _handle_errors


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the CA bundle and the optional client certificate and key (PEM)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials built from the files."""
        ca = Path(self.ca).read_bytes()
        cert = Path(self.cert).read_bytes() if self.cert else None
        key = Path(self.key).read_bytes() if self.key else None
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)


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
