"""The client of the ``hafo dev`` control socket: what ``hafo dev power-off|power-on|fault|
status`` use to reach the running dev cluster (``hafo.local.dev_protocol``)."""

from __future__ import annotations

import socket
from pathlib import Path

from hafo.local.dev_protocol import (
    SOCKET_NAME,
    ControlReply,
    ControlRequest,
    DevUnavailable,
    socket_path,
)


def call(dev_dir: Path, request: ControlRequest, timeout: float = 60.0) -> ControlReply:
    """Send one request to the dev cluster at ``dev_dir``; DevUnavailable if none answers."""
    path = socket_path(dev_dir)
    if not path.exists():
        raise DevUnavailable(f"no dev cluster runs at {dev_dir} (no {SOCKET_NAME})")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(request.to_json().encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise DevUnavailable(f"the dev cluster at {dev_dir} did not answer within "
                                 f"{timeout:g}s") from None
        except OSError as exc:
            raise DevUnavailable(f"no dev cluster runs at {dev_dir} "
                                 f"({exc.strerror or exc})") from None
    if not data:
        raise DevUnavailable(f"the dev cluster at {dev_dir} closed the connection (stopping?)")
    return ControlReply.from_json(data.decode(errors="replace"))
