"""The docs' "Run it on your own nodes" (docs/getting-started/your-nodes.md, where the README
points newcomers), word by word: every command between the
``manual-path`` markers runs, in order, from the repository root with the virtual
environment's directory first on PATH (``. .venv/bin/activate``), and does what it says.

Conventions the README keeps (and this test relies on):
- commands sit in ```sh blocks between ``<!-- manual-path:start -->`` and
  ``<!-- manual-path:end -->``; text after `` #`` is a comment;
- a command whose comment says ``stays up`` is a daemon in a terminal of its own: started in
  the background; the next command runs once it listens (etcd on 127.0.0.1:2379, a daemon on
  its config's ``api.listen``); at the end each is stopped with SIGINT (Ctrl-C), and every
  process it started is gone within a bound;
- a command whose comment says ``Ctrl-C`` runs until interrupted: it is stopped with SIGINT
  after a few seconds and must then exit 0 having printed something;
- any other command must exit 0.

The commands use fixed ports (2379, 2380, 8600, 8601) and /tmp/hafo, as a newcomer's would:
the test is skipped when one of those ports is taken or /tmp/hafo exists (it is not ours to
remove), and removes /tmp/hafo at the end. ``HAFO_README`` names another file to read instead
of that page (to try a draft).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from hafo.local.procs import descendants, kill_pid, pid_alive

from .readme_steps import Step, run_until_ctrl_c, steps_between

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
START, END = "<!-- manual-path:start -->", "<!-- manual-path:end -->"
STATE = Path("/tmp/hafo")
PORTS = (2379, 2380, 8600, 8601)
LISTEN_TIMEOUT = 60.0
FOLLOW_SECONDS = 5.0
GONE_TIMEOUT = 20.0


def manual_steps(text: str) -> list[Step]:
    """The commands of the ```sh blocks between the manual-path markers, in order."""
    return steps_between(text, START, END)


def test_manual_steps_are_parsed() -> None:
    text = (f"intro\n{START}\n```sh\netcd --data-dir d   # terminal 1; stays up\n```\n"
            "```\nnot a command\n```\n"
            "```sh\nhafo logs counter -f   # Ctrl-C to stop\n# a comment\nhafo status\n```\n"
            f"{END}\n```sh\nhafo outside\n```\n")
    steps = manual_steps(text)
    assert steps == [Step("etcd --data-dir d", "terminal 1; stays up"),
                     Step("hafo logs counter -f", "Ctrl-C to stop"), Step("hafo status", "")]
    assert steps[0].daemon and steps[1].interactive
    assert not steps[2].daemon and not steps[2].interactive


def listen_port(argv: list[str]) -> int:
    """The port a daemon of the path listens on once it is up."""
    if Path(argv[0]).name == "etcd":
        return 2379
    assert argv[0] == "hafo" and "--config" in argv, f"unknown daemon {argv}"
    config = yaml.safe_load((ROOT / argv[argv.index("--config") + 1]).read_text())
    return int(str(config["api"]["listen"]).rsplit(":", 1)[1])


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Walk:
    """The daemons started so far, and every process they ever had."""

    env: dict[str, str]
    logs: Path
    daemons: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)

    def track(self) -> None:
        for _, proc in self.daemons:
            if proc.poll() is None:
                self.seen.add(proc.pid)
                self.seen.update(descendants(proc.pid))

    def resolve(self, argv: list[str]) -> list[str]:
        """The program as the activated shell finds it (the virtual environment first)."""
        found = shutil.which(argv[0], path=self.env["PATH"])
        assert found, f"{argv[0]}: not found on PATH"
        return [found, *argv[1:]]

    def run(self, step: Step) -> None:
        argv = shlex.split(step.command)
        if step.daemon:
            self.start_daemon(step.command, argv)
        elif step.interactive:
            self.run_until_ctrl_c(step.command, argv)
        else:
            done = subprocess.run(self.resolve(argv), capture_output=True, text=True,
                                  timeout=120, env=self.env, cwd=ROOT)
            assert done.returncode == 0, f"{step.command}: {done.returncode}\n{done.stderr}"
        self.track()

    def start_daemon(self, command: str, argv: list[str]) -> None:
        port = listen_port(argv)
        log = self.logs / f"daemon-{len(self.daemons)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(self.resolve(argv), stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env, cwd=ROOT, start_new_session=True)
        self.daemons.append((command, proc))
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while not listening(port):
            assert proc.poll() is None, f"{command} exited {proc.returncode}:\n" \
                f"{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{command}: nothing on port {port}"
            time.sleep(0.2)

    def run_until_ctrl_c(self, command: str, argv: list[str]) -> None:
        out = run_until_ctrl_c(command, self.resolve(argv), self.env, ROOT, FOLLOW_SECONDS)
        if argv[:2] == ["hafo", "logs"]:
            assert "start at step" in out, out

    def stop(self) -> list[int]:
        """Ctrl-C each daemon, newest first (as the README says); the pids still alive after
        the bound (none, normally: a workload stops once its agent's lease is over)."""
        self.track()
        for _, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
        deadline = time.monotonic() + GONE_TIMEOUT
        while any(pid_alive(p) for p in self.seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        return sorted(p for p in self.seen if pid_alive(p))

    def kill(self) -> None:
        """SIGKILL every process seen, by pid (clean-up whatever happened)."""
        self.track()
        for pid in sorted(self.seen):
            kill_pid(pid, signal.SIGKILL)
        for _, proc in self.daemons:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_readme_manual_path(tmp_path: Path) -> None:
    page = ROOT / "docs" / "getting-started" / "your-nodes.md"
    source = Path(os.environ.get("HAFO_README", page))
    steps = manual_steps(source.read_text())
    assert 3 <= len(steps) <= 6, "the README promises a few commands"
    assert [Path(shlex.split(s.command)[0]).name for s in steps if s.daemon] == \
        ["etcd", "hafo", "hafo"], "etcd, a controller and an agent stay up"
    busy = [p for p in PORTS if not port_free(p)]
    if busy:
        pytest.skip(f"ports {busy} are taken here; the README's commands need them")
    if STATE.exists():
        pytest.skip(f"{STATE} exists; the README's commands would use it (not ours to remove)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])  # . .venv/bin/activate
    # the agent's temporary directory, where workloads get theirs: the agent is killed at the
    # end with its workload still assigned, so nothing would remove it from the real /tmp
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    walk = Walk(env, tmp_path)
    started = time.monotonic()
    try:
        for step in steps:
            walk.run(step)
        took = time.monotonic() - started
        left = walk.stop()
        assert not left, f"processes left running after Ctrl-C: {left}"
        print(f"README manual path: {len(steps)} commands in {took:.1f}s")
    finally:
        walk.kill()
        shutil.rmtree(STATE, ignore_errors=True)
