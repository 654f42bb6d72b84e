"""The false-positive stress: every core saturated by busy loops and a neighbour that hammers
a disk with fsyncs, as a busy machine does (``benchmarks/false_positives.py``, and the
machine tests' raft-leader power cuts). Started and stopped by pid, never by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from hafo.local.procs import kill_pid, spawn, stop_process

BURN = "import time\nwhile True:\n    pass\n"
FSYNC = """
import os, sys

path = sys.argv[1]
block = os.urandom(64 * 1024)
while True:
    with open(path, 'wb') as fh:
        for _ in range(16):
            fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
"""


class Stress:
    """``with Stress(scratch_dir):`` one busy loop per core and one fsync neighbour writing
    in ``scratch_dir`` (put it on the disk the system under test uses)."""

    def __init__(self, scratch_dir: Path, burners: int | None = None) -> None:
        self.scratch_dir = scratch_dir
        self.burners = burners if burners is not None else (os.cpu_count() or 2)
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> Stress:
        """Start the load (idempotent)."""
        if self.procs:
            return self
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.burners):
            self.procs.append(spawn([sys.executable, "-c", BURN],
                                    self.scratch_dir / f"burn{i}.log"))
        self.procs.append(spawn([sys.executable, "-c", FSYNC,
                                 str(self.scratch_dir / "fsync-neighbour.bin")],
                                self.scratch_dir / "fsync.log"))
        return self

    def stop(self) -> None:
        """Stop every process this started, by pid."""
        for proc in self.procs:
            kill_pid(proc.pid)
            stop_process(proc, grace=1.0)
        self.procs.clear()
        (self.scratch_dir / "fsync-neighbour.bin").unlink(missing_ok=True)

    def describe(self) -> str:
        """What the load is, for a report."""
        return f"{self.burners} CPU burners (every core) + 1 fsync neighbour"

    def __enter__(self) -> Stress:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
