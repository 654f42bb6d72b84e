"""``hafo dev``: a local cluster that stays up until Ctrl-C, and the commands that control it.

``hafo dev [--nodes N] [--gpus G] [--cluster NAME] [--dir DIR] [--fast]`` starts the cluster
(``hafo.local.dev_server``); ``hafo dev power-off|power-on|fault|status`` talk to a running one
through ``$HAFO_DEV`` (the directory ``hafo dev`` prints in its export line).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from hafo.commands.base import (
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    json_arg,
    positive_int,
)

MAX_NODES = 32
MAX_GPUS = 64  # node.gpus.simulate.count's limit
START_FLAGS = ("--nodes", "--gpus", "--cluster", "--dir", "--fast")

HELP = """\
Without an action: start a local cluster (embedded etcd, 2 controllers, N agents with
simulated GPUs) and keep it up until Ctrl-C (or SIGTERM/SIGHUP), which stops every process it
started and removes its temporary directory. It prints an `export HAFO_ETCD=...
HAFO_CLUSTER=... HAFO_DEV=...` line: paste it into another terminal, where the usual
commands (hafo submit, hafo workloads, hafo logs...) and the actions below reach the cluster.

actions (from another terminal, found through $HAFO_DEV):
  power-off NODE   power loss: every process of the node killed at once
  power-on NODE    start the node again
  fault NODE --gpu I (--xid N | --lost | --ecc-dbe N | --thermal C | --clear)
                   set (or clear) a simulated GPU fault on the node
  status           which nodes are powered, their faults, the dashboards

exit codes: 0 ok, 1 error, 2 bad input, 3 no dev cluster runs at $HAFO_DEV, 4 no such node
"""


def _count(limit: int) -> Any:
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit}, got {value}")
        return value
    return parse


def _cluster_name(text: str) -> str:
    from hafo.local.dev_server import CLUSTER_NAME_RE

    if not CLUSTER_NAME_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"must be lowercase letters, digits and '-' (at most 63), got {text!r}")
    return text


def _gpu_index(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a GPU index, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be degrees C, got {text!r}") from None
    if not 0 < value <= 200:
        raise argparse.ArgumentTypeError(f"must be between 0 and 200 C, got {value:g}")
    return value


def _dev_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dev", default=None, metavar="DIR",
                   help="the running dev cluster's directory (default $HAFO_DEV, which "
                        "`hafo dev` prints)")


def register(sub: Any) -> None:
    """Add the ``dev`` subparser and its actions."""
    p = sub.add_parser("dev", help="a local cluster that stays up until Ctrl-C, and its "
                                   "power and GPU-fault controls",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=_count(MAX_NODES), default=None, metavar="N",
                   help=f"how many nodes (default 3, at most {MAX_NODES})")
    p.add_argument("--gpus", type=_count(MAX_GPUS), default=None, metavar="G",
                   help=f"simulated GPUs per node (default 4, at most {MAX_GPUS})")
    p.add_argument("--cluster", type=_cluster_name, default=None, metavar="NAME",
                   help="cluster name (default 'dev')")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help="keep the cluster's state and logs in DIR (created; kept after "
                        "Ctrl-C) instead of a temporary directory")
    p.add_argument("--fast", action="store_const", const=True, default=None,
                   help="the fast timing profile: lease TTL 1 s, etcd's election timeout "
                        "150 ms (timing.profile: fast; default: lease TTL 3 s)")
    actions = p.add_subparsers(dest="dev_action", metavar="[ACTION]", required=False)
    for name, text in (("power-off", "power loss: kill every process of NODE at once"),
                       ("power-on", "start NODE again after a power-off (a powered NODE "
                                    "whose agent exited: start its agent again)")):
        a = actions.add_parser(name, help=text, description=text)
        a.add_argument("node", metavar="NODE", help="the node's name")
        _dev_arg(a)
    a = actions.add_parser("fault", help="set or clear a simulated GPU fault on NODE",
                           description="Write a simulated GPU fault into NODE's faults file "
                                       "(it replaces that GPU's earlier fault); the agent's "
                                       "health checks see it within a second.")
    a.add_argument("node", metavar="NODE", help="the node's name")
    a.add_argument("--gpu", type=_gpu_index, required=True, metavar="I", help="GPU index")
    kind = a.add_mutually_exclusive_group(required=True)
    kind.add_argument("--xid", type=positive_int, metavar="N",
                      help="an Xid error (e.g. 79: fallen off the bus, 48: double-bit ECC)")
    kind.add_argument("--lost", action="store_true", help="the GPU is gone from the bus")
    kind.add_argument("--ecc-dbe", type=positive_int, metavar="N",
                      help="N volatile double-bit ECC errors")
    kind.add_argument("--thermal", type=_temperature, metavar="C",
                      help="thermal slowdown at C degrees")
    kind.add_argument("--clear", action="store_true", help="clear the GPU's fault")
    _dev_arg(a)
    a = actions.add_parser("status", help="which nodes are powered, their GPU faults, the "
                                          "dashboards", description="The running dev cluster.")
    json_arg(a)
    _dev_arg(a)


def run(args: argparse.Namespace) -> int:
    """Run ``hafo dev`` (start the cluster) or one of its actions."""
    if args.dev_action is None:
        return _start(args)
    given = [flag for flag in START_FLAGS if getattr(args, flag.lstrip("-")) is not None]
    if given:
        raise CliError(f"hafo dev {args.dev_action}: {given[0]} is for starting a dev cluster "
                       "(`hafo dev` without an action)", EXIT_USAGE)
    return _control(args)


def _start(args: argparse.Namespace) -> int:
    from hafo.local.dev_server import DevError, DevOptions, run_dev

    options = DevOptions(nodes=args.nodes or 3, gpus=args.gpus or 4,
                         cluster=args.cluster or "dev", dir=Path(args.dir) if args.dir else None,
                         profile="fast" if args.fast else "default")
    try:
        return run_dev(options)
    except DevError as exc:
        raise CliError(f"hafo dev: {exc}", exc.code) from None


def _control(args: argparse.Namespace) -> int:
    from hafo.local.dev_client import call
    from hafo.local.dev_protocol import ControlRequest, DevUnavailable, GpuFault

    prog = f"hafo dev {args.dev_action}"
    where = args.dev or os.environ.get("HAFO_DEV")
    if not where:
        raise CliError(f"{prog}: $HAFO_DEV is not set: start `hafo dev` and paste the export "
                       "line it prints (or pass --dev DIR)", EXIT_UNAVAILABLE)
    origin = "--dev" if args.dev else "$HAFO_DEV"
    fault = None
    if args.dev_action == "fault":
        fault = GpuFault(xid=args.xid, lost=args.lost, ecc_dbe=args.ecc_dbe,
                         thermal=args.thermal)
    request = ControlRequest(action=args.dev_action, node=getattr(args, "node", None),
                             gpu=getattr(args, "gpu", None), fault=fault)
    try:
        reply = call(Path(where), request)
    except DevUnavailable as exc:
        raise CliError(f"{prog}: {origin}={where}: {exc}", EXIT_UNAVAILABLE) from None
    if not reply.ok:
        raise CliError(f"{prog}: {reply.message}", reply.code or 1)
    if args.dev_action != "status":
        print(reply.message)
        return 0
    status = reply.status
    if status is None:
        raise CliError(f"{prog}: the dev cluster sent no status", 1)
    if args.json:
        print(json.dumps(status.to_dict(), indent=2, sort_keys=True))
        return 0
    print(f"cluster {status.cluster} in {status.dir}; etcd {','.join(status.etcd)}")
    for c in status.controllers:
        print(f"  {c.name:<8} {'running' if c.running else 'stopped':<8} "
              f"dashboard {c.dashboard}")
    print(f"{'NODE':<12} {'POWER':<6} {'AGENT':<26} GPU FAULTS")
    for n in status.nodes:
        faults = "; ".join(f"GPU {gpu}: {json.dumps(f, sort_keys=True)}"
                           for gpu, f in sorted(n.faults.items())) or "-"
        print(f"{n.name:<12} {'on' if n.powered else 'off':<6} {n.agent_words():<26} {faults}")
    for n in status.nodes:
        if n.powered and n.agent_alive is False:
            print(f"{n.name}: its agent exited; `hafo dev power-on {n.name}` starts it again")
    return 0
