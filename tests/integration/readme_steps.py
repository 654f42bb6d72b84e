"""What the README-driven tests share: the commands between a pair of markers, and running
one that lasts until Ctrl-C (tests/integration/test_readme_path.py, test_readme_manual.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    """One command of a path: the command line and its comment."""

    command: str
    comment: str

    @property
    def daemon(self) -> bool:
        """Stays up in a terminal of its own."""
        return "stays up" in self.comment

    @property
    def interactive(self) -> bool:
        """Runs until Ctrl-C."""
        return "Ctrl-C" in self.comment


def steps_between(text: str, start: str, end: str) -> list[Step]:
    """The commands of the ```sh blocks between the markers, in order."""
    assert start in text and end in text, f"the README lacks the {start} ... {end} markers"
    section = text.split(start, 1)[1].split(end, 1)[0]
    steps = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            command, _, comment = line.partition(" #")
            steps.append(Step(command.strip(), comment.strip()))
    return steps


def run_until_ctrl_c(command: str, argv: list[str], env: dict[str, str], cwd: Path,
                     seconds: float, before: Callable[[], None] | None = None) -> str:
    """Run ``argv`` for ``seconds`` (after ``before`` returned, if given) and until it has
    printed a first line, then Ctrl-C it: it must still run then, exit 0. Returns its output.

    Waiting for a line is what a user does (a Ctrl-C before the command began is an ordinary
    interrupt, exit 130); a Python start-up on a busy machine outlasts any fixed wait."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        started = time.monotonic()
        if before is not None:
            before()
        while time.monotonic() - started < seconds or (
                not lines and time.monotonic() - started < seconds + 60):
            assert proc.poll() is None, f"{command} ended before Ctrl-C: {proc.returncode}"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
        reader.join(10)
        err = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = "".join(lines)
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{err}"
    assert out.strip(), f"{command} printed nothing"
    return out
