"""The "power supply" of a simulated node: a child subreaper that runs the agent.

Every process of the node (agent, guards, workloads, and orphans of any of them) stays a
descendant of this process, so the local cluster can cut a node's power by freezing and
killing exactly that tree, by pid. If the agent exits, the node stays powered (its guards keep
running) until this process is told to stop; SIGUSR1 starts the agent again if it is not
running (as systemd's Restart= would). Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    """``python -m hafo.local.nodeinit PIDFILE -- argv...``"""
    pidfile, argv = Path(argv[0]), argv[2:]
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    restart_requested = 0.0

    def on_usr1(_sig: int, _frame: object) -> None:
        nonlocal restart_requested
        restart_requested = time.monotonic()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    child = subprocess.Popen(argv)
    pidfile.write_text(f"{child.pid}\n")
    while not stop:
        if restart_requested:
            # A just-killed agent may not be reaped yet: keep asking for up to 2 s.
            if child.poll() is not None:
                child = subprocess.Popen(argv)
                pidfile.write_text(f"{child.pid}\n")
                restart_requested = 0.0
            elif time.monotonic() - restart_requested > 2.0:
                restart_requested = 0.0
        with contextlib.suppress(ChildProcessError):
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
