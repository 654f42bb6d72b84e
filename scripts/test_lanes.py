"""Run hafo's test suite in lanes (``make test``), and tear down everything it started when
it is stopped from outside (SIGTERM from a CI timeout, Ctrl-C).

The lanes (tests/README.md):

- ``unit``: the pure tests and the plugins', on 2 workers.
- ``integration``: the integration tests that time nothing, on several workers (each test
  has its own ports, directories and cluster name).
- ``timing``: the tests whose assertions are about time (failover figures, false positives,
  stalls, chaos; marker ``timing``), each alone with its generous bounds.
- ``machines``: the systemd machines and the end-to-end tools (Ansible, Prometheus,
  Chromium), one at a time.

The lanes run one after the other (``AFTER``): on 2 cores the suite is CPU-bound.

This runner is the parent of every test process: it makes itself their child subreaper
(prctl PR_SET_CHILD_SUBREAPER), so whatever a test starts and orphans (an etcd, an agent,
an HAProxy, a machine) is re-parented to it and not to init. On SIGTERM or SIGINT (or when
its own parent, make, dies) it asks every lane to stop (SIGTERM: pytest runs the fixtures'
teardown, which stops clusters by pid), waits a grace period, then kills its remaining
children, and theirs as they are re-parented, until none is left. It only ever signals its
own children: a child's pid cannot be reused before this process reaps it.

``HAFO_TEST_LANES=unit,integration`` runs only the lanes named (arguments go to every
lane's pytest); ``HAFO_TEST_WORKERS`` sets
the integration lane's workers (default 3). The lanes' output and JUnit reports are kept in
``build/test-lanes/``; the slowest 25 tests of the whole run, then each failed test with its
message's head and tail, are printed at the end.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("HAFO_TEST_LANES_DIR", ROOT / "build" / "test-lanes"))
PLUGINS = ["plugins/hafo-check-openai/tests", "plugins/hafo-check-training/tests"]
GRACE_S = 45.0  # for pytest's teardown after SIGTERM, before anything is killed
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Lane:
    """One pytest run of the suite."""

    name: str
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    wall: float = 0.0
    log: Path = field(default_factory=Path)

    def start(self) -> None:
        """Start the lane in a session of its own (its workers share its process group)."""
        self.log = OUT / f"{self.name}.log"
        junit = OUT / f"{self.name}.xml"
        junit.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                f"--junitxml={junit}", "-o", "junit_family=xunit1", *self.args]
        print(f"[lanes] {self.name}: {' '.join(argv[2:])}", flush=True)
        self.started = time.monotonic()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, "HAFO_TEST_LANE": self.name})

    def poll(self) -> int | None:
        """The lane's exit code once it has ended (then its wall time is known)."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None and not self.wall:
            self.wall = time.monotonic() - self.started
        return code

    def stop(self) -> None:
        """Ask the lane (pytest and its workers) to stop and tear down."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)


def lanes(workers: int) -> dict[str, Lane]:
    """Every lane, by name, in the order they start."""
    return {
        "unit": Lane("unit", ["-n", "2", "tests/unit", *PLUGINS]),
        "integration": Lane("integration", ["-n", str(workers), "--dist", "loadgroup",
                                            "-m", "not timing", "tests/integration"]),
        "timing": Lane("timing", ["-m", "timing", "tests/integration"]),
        "machines": Lane("machines", ["tests/hosts", "tests/e2e"]),
    }


# Which lane waits for which: one after the other, the unit lane first (its failures are the
# quickest answer). On 2 cores the suite is CPU-bound: the integration lane keeps both cores
# busy, and a machine or timing test beside it misses its bounds (measured: two machine tests
# failed, and both lanes took 60-70 % longer than alone).
AFTER = {"integration": "unit", "timing": "integration", "machines": "timing"}


def compile_sources() -> None:
    """Byte-compile hafo, its plugins and the tests once, before any lane starts.

    A test run starts some thousands of Python processes (agents, controllers, guards,
    workloads, commands); where ``PYTHONDONTWRITEBYTECODE`` is set (as on these machines),
    each would otherwise compile hafo's sources again (0.5 s of CPU for an agent). Python
    still reads the bytecode that is there; the lanes run without the variable, so what a
    test imports from elsewhere is compiled once too.
    """
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", "hafo",
                             "tests", "scripts", *(p.split("/tests")[0] for p in PLUGINS)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            check=False, text=True)
    if result.returncode != 0:
        print(f"[lanes] warning: byte-compiling failed: {result.stderr[-2000:]}", flush=True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"[lanes] byte-compiled the sources in {time.monotonic() - started:.1f} s",
          flush=True)


def become_subreaper() -> None:
    """Orphans of our descendants become our children; we get SIGTERM when our parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("[lanes] warning: not a child subreaper; orphans go to init", flush=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def live_children() -> list[int]:
    """Our direct children that have not exited (zombies excluded)."""
    mine = str(os.getpid())
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("PPid", "").strip() == mine and not fields.get("State", "").startswith("Z"):
            children.append(int(entry.name))
    return children


def reap() -> None:
    """Collect every exited child (re-parented orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_everything_left(deadline_s: float = 30.0) -> list[int]:
    """SIGKILL our children until none is left (their own children are re-parented to us as
    they die); the pids killed."""
    killed: list[int] = []
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        reap()
        children = live_children()
        if not children:
            break
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)  # our child: its pid is ours until we reap it
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    reap()
    return killed


def slowest(names: list[str], count: int = 25) -> list[tuple[float, str]]:
    """The slowest test cases of the lanes' JUnit reports."""
    cases: list[tuple[float, str]] = []
    for name in names:
        path = OUT / f"{name}.xml"
        if not path.exists():
            continue
        try:
            tree = ET.parse(path)
        except ET.ParseError:
            continue
        for case in tree.iter("testcase"):
            if not case.get("name"):
                continue  # an interrupted run's placeholder
            label = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time", 0) or 0), f"[{name}] {label}"))
    return sorted(cases, reverse=True)[:count]


def failures(names: list[str], head: int = 900, tail: int = 600) -> list[str]:
    """Each failed or errored test case of the lanes' JUnit reports, with the head and the
    tail of its message: the run's last lines then say what failed and why, where a log
    viewer shows only the end of a long output (CI)."""
    found: list[str] = []
    for name in names:
        path = OUT / f"{name}.xml"
        try:
            tree = ET.parse(path)
        except (OSError, ET.ParseError):
            continue
        for case in tree.iter("testcase"):
            for outcome in [*case.iter("failure"), *case.iter("error")]:
                label = f"{case.get('classname', '')}::{case.get('name', '')}"
                # The report's text is the whole traceback; its "E" lines say what failed
                # (the message attribute is cut short by pytest).
                full = outcome.text or outcome.get("message") or ""
                said = [line[1:].strip() for line in full.splitlines() if line.startswith("E ")]
                text = ("\n".join(said) if said else full).strip()
                if len(text) > head + tail + 20:
                    text = f"{text[:head]}\n  [... {len(text) - head - tail} characters ...]\n" \
                           f"{text[-tail:]}"
                found.append(f"[{name}] {label} ({outcome.tag}):\n" + "\n".join(
                    f"    {line}" for line in text.splitlines()))
    return found


def main() -> int:
    """Run the lanes named in HAFO_TEST_LANES (default all); exit non-zero if one failed."""
    OUT.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    every = lanes(int(os.environ.get("HAFO_TEST_WORKERS", "3")))
    for lane in every.values():
        lane.args += sys.argv[1:]  # e.g. -k EXPR, -x: to every lane
    chosen = [n.strip() for n in os.environ.get("HAFO_TEST_LANES", ",".join(every)).split(",")
              if n.strip()]
    unknown = [n for n in chosen if n not in every]
    if unknown:
        print(f"HAFO_TEST_LANES: unknown lane(s) {', '.join(unknown)}; the lanes are "
              f"{', '.join(every)}", file=sys.stderr)
        return 2
    compile_sources()
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    began = time.monotonic()
    pending = [every[n] for n in chosen]
    running: list[Lane] = []
    done: dict[str, int] = {}
    while (pending or running) and not stopping:
        for lane in list(pending):
            before = AFTER.get(lane.name)
            if before in done or before not in chosen or before is None:
                pending.remove(lane)
                lane.start()
                running.append(lane)
        for lane in list(running):
            code = lane.poll()
            if code is None:
                continue
            running.remove(lane)
            done[lane.name] = code
            print(f"\n[lanes] ===== {lane.name}: exit {code} in {lane.wall:.0f} s =====",
                  flush=True)
            sys.stdout.write(lane.log.read_text(errors="replace"))
            sys.stdout.flush()
        reap()
        time.sleep(0.5)
    if stopping:
        print(f"\n[lanes] signal {stopping[0]}: stopping every lane "
              f"(teardown for up to {GRACE_S:.0f} s)", flush=True)
        for lane in running:
            lane.stop()
        until = time.monotonic() + GRACE_S
        while any(lane.poll() is None for lane in running) and time.monotonic() < until:
            reap()
            time.sleep(0.2)
        for lane in running:
            tail = lane.log.read_text(errors="replace")[-3000:]
            print(f"[lanes] {lane.name} (stopped):\n{tail}", flush=True)
    killed = kill_everything_left()
    if killed:
        print(f"[lanes] killed {len(killed)} process(es) left running: {killed}", flush=True)
    print("\n[lanes] slowest 25 tests:", flush=True)
    for seconds, label in slowest(chosen):
        print(f"  {seconds:8.2f}s  {label}")
    failed = failures(chosen)
    if failed:
        print(f"\n[lanes] {len(failed)} failed test(s):", flush=True)
        for text in failed:
            print(text, flush=True)
    total = time.monotonic() - began
    print("\n[lanes] " + ", ".join(f"{n} exit {done.get(n, 'stopped')} "
                                   f"({every[n].wall:.0f} s)" for n in chosen)
          + f"; {total:.0f} s in all", flush=True)
    if stopping:
        return 128 + stopping[0]
    if killed:
        return 1  # a test left processes behind: a defect even if everything passed
    return 0 if all(code == 0 for code in done.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
