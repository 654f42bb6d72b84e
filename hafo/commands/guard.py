"""``hafo guard INSTANCE_DIR`` (internal): the parent and fence of one workload process
(``hafo.agent.guard``), started by the agent; it configures its own logging and must start
fast."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add the ``guard`` subparser."""
    p = sub.add_parser("guard", help="(internal) parent and fence of one workload process")
    p.add_argument("instance_dir", help="the instance directory the agent prepared")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo guard``."""
    from hafo.agent import guard

    return guard.main([args.instance_dir])
