"""A throwaway certificate authority for local clusters and tests (``openssl``, no shell).

Makes a CA, a server certificate for 127.0.0.1/localhost (etcd members, the API) and a client
certificate (daemons and the CLI), all EC P-256, valid for a few days.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """PEM file paths of a local CA and the certificates it signed."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _signed(directory: Path, name: str, subject: str, extensions: str, ca: Path,
            ca_key: Path) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}-key.pem", directory / f"{name}.csr",
                      directory / f"{name}.pem")
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(csr), "-subj", subject)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "3", "-out", str(cert), "-extfile", str(ext))
    key.chmod(0o600)
    return cert, key


def make_pki(directory: Path, client_name: str = "hafo") -> Pki:
    """Create the CA and certificates in ``directory`` (keys mode 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(ca_key), "-out", str(ca), "-days", "3", "-subj", "/CN=hafo test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    ca_key.chmod(0o600)
    server_cert, server_key = _signed(
        directory, "server", "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        ca, ca_key)
    client_cert, client_key = _signed(directory, "client", f"/CN={client_name}",
                                      "extendedKeyUsage=clientAuth\n", ca, ca_key)
    return Pki(ca, server_cert, server_key, client_cert, client_key)
