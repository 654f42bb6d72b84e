"""TLS to etcd: the certificate files (the client over TLS is ``hafo.store.aetcd_adapter.
SecureClient``: aetcd only opens plaintext channels).

The certificate files are read once per connection (so a renewed certificate is picked up at
the next reconnect); the server's certificate is checked against ``ca``, and ``cert``/``key``
are sent when etcd asks for a client certificate (``--client-cert-auth``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


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
