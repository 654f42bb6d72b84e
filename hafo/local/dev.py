"""``hafo dev``: a local cluster that stays up until Ctrl-C, and its control socket.

The pieces live in modules of their own, each with one job; this module gathers their names:

- ``hafo.local.dev_protocol``: the messages on the socket (``ControlRequest``,
  ``ControlReply``, ``DevStatus``...), declared like ``hafo.model``'s formats, and
  ``check_request``;
- ``hafo.local.dev_client``: ``call``, the client the other ``hafo dev`` commands use;
- ``hafo.local.dev_server``: the running dev cluster (``run_dev``, ``DevCluster``), which
  serves the socket, and what it prints (``banner``, ``export_line``).

Importing it is cheap: the cluster machinery is imported when a cluster starts.
"""

from __future__ import annotations

from hafo.local.dev_client import call
from hafo.local.dev_protocol import (
    ACTIONS,
    MAX_REQUEST,
    NOT_FOUND,
    OK,
    SOCKET_NAME,
    UNAVAILABLE,
    USAGE,
    ControllerState,
    ControlReply,
    ControlRequest,
    DevStatus,
    DevUnavailable,
    GpuFault,
    NodeState,
    check_request,
    parse_request,
    socket_path,
)
from hafo.local.dev_server import (
    AGENT_RESTART,
    CLUSTER_NAME_RE,
    CONTROLLERS,
    MAX_SOCKET_PATH,
    DevCluster,
    DevError,
    DevOptions,
    banner,
    export_line,
    prepare_dir,
    run_dev,
    say,
)

__all__ = ["ACTIONS", "AGENT_RESTART", "CLUSTER_NAME_RE", "CONTROLLERS", "MAX_REQUEST",
           "MAX_SOCKET_PATH", "NOT_FOUND", "OK", "SOCKET_NAME", "UNAVAILABLE", "USAGE",
           "ControlReply", "ControlRequest", "ControllerState", "DevCluster", "DevError",
           "DevOptions", "DevStatus", "DevUnavailable", "GpuFault", "NodeState", "banner",
           "call", "check_request", "export_line", "parse_request", "prepare_dir", "run_dev",
           "say", "socket_path"]
