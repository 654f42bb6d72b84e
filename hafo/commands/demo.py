"""``hafo demo``: an embedded cluster that fails a workload over (``hafo.demo``)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add the ``demo`` subparser."""
    p = sub.add_parser("demo", help="embedded cluster that fails a workload over")
    p.add_argument("--keep", action="store_true", help="keep the temp directory")


def run(args: argparse.Namespace) -> int:
    """Run ``hafo demo``."""
    from hafo.demo import run_demo

    return run_demo(keep=args.keep)
