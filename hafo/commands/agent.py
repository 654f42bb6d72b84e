"""``hafo agent --config FILE``: the node daemon (its start-up: ``hafo.agent.main``);
``--check`` validates the config and exits."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any


def register(sub: Any) -> None:
    """Add the ``agent`` subparser."""
    p = sub.add_parser("agent", help="node daemon")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--check", action="store_true",
                   help="validate the config file and exit (0: valid; 2: the error, "
                        "naming the field)")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo agent``: nothing is imported here before the agent's early lease renewal
    (``hafo.agent.main.run``)."""
    from hafo.agent import main

    if args.check:
        main.check(args.config)
        print(f"{args.config}: a valid agent config")
        return 0
    return asyncio.run(main.run(args.config))
