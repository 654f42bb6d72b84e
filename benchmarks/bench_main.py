"""How every benchmark ends: its exit status, or one line for an interruption or a failure
(a cluster that never came up, a port in use, a missing binary), never a traceback. The
benchmarks stop what they started in their own ``finally`` blocks."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main`` and exit with its status."""
    name = Path(sys.argv[0]).name
    try:
        code = main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        sys.exit(130)
    except (TimeoutError, OSError, RuntimeError, ValueError, AssertionError) as exc:
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code or 0)
