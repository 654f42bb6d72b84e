"""The README's newcomer path, word by word: every command between the `newcomer-path`
markers runs, in order, against a real `hafo dev`, and succeeds.

Conventions the README keeps (and this test relies on):
- commands sit in ```sh blocks between ``<!-- newcomer-path:start -->`` and
  ``<!-- newcomer-path:end -->``; text after `` #`` is a comment;
- ``hafo dev`` starts the cluster (here: in the background); the ``export HAFO_...`` line
  stands for the one it prints; ``. .venv/bin/activate`` puts this Python's directory first on
  PATH;
- a command whose comment says ``Ctrl-C`` runs until interrupted: it is stopped with SIGINT
  once what the README promises has happened (``--watch``) or after a few seconds, and must
  then exit 0 having printed something;
- ``<node>`` is the node counter runs on when it first appears, ``<new-node>`` the node it
  runs on when that first appears.

``HAFO_README`` names another file to read instead of README.md (to try a draft).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .readme_steps import Step, run_until_ctrl_c, steps_between
from .test_dev import ROOT, DevProcess, assert_all_gone, dev_processes, hafo

__all__ = ["dev_processes"]  # the fixture, used below

pytestmark = pytest.mark.timeout(420)
START, END = "<!-- newcomer-path:start -->", "<!-- newcomer-path:end -->"
BIN = Path(sys.executable).parent
FOLLOW_SECONDS = 5.0
WAIT_SECONDS = 90.0


def readme_steps(text: str) -> list[Step]:
    """The commands of the ```sh blocks between the newcomer-path markers, in order."""
    return steps_between(text, START, END)


def test_readme_steps_are_parsed() -> None:
    text = (f"intro\n{START}\n```sh\n. .venv/bin/activate\nhafo dev\n```\n"
            "```\nnot a command\n```\n"
            "```sh\nhafo workloads --watch   # Ctrl-C once it runs\n# only a comment\n```\n"
            f"{END}\n```sh\nhafo outside\n```\n")
    assert readme_steps(text) == [Step(". .venv/bin/activate", ""), Step("hafo dev", ""),
                                  Step("hafo workloads --watch", "Ctrl-C once it runs")]
    assert readme_steps(text)[2].interactive


def counter(env: dict[str, str]) -> dict[str, Any]:
    """The counter workload's view (`hafo workloads --json`)."""
    done = hafo("workloads", "--json", env=env)
    assert done.returncode == 0, done.stderr
    found = [w for w in json.loads(done.stdout) if w["name"] == "counter"]
    assert found, done.stdout
    return found[0]


def placement(env: dict[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """Where counter runs: (node, GPU UUIDs)."""
    view = counter(env)
    return view["node"], tuple(view["gpus"])


class Walk:
    """The state of one walk through the path."""

    def __init__(self, dev_processes: list[DevProcess]) -> None:
        self.dev_processes = dev_processes
        self.dev: DevProcess | None = None
        self.env: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.disrupted: tuple[str | None, tuple[str, ...]] | None = None

    def substitute(self, command: str) -> str:
        for placeholder in ("<node>", "<new-node>"):
            if placeholder in command and placeholder not in self.names:
                node, _ = placement(self.env)
                assert node is not None, f"counter is not placed when {command!r} runs"
                self.names[placeholder] = node
            if placeholder in command:
                command = command.replace(placeholder, self.names[placeholder])
        assert "<" not in command, f"unknown placeholder in {command!r}"
        return command

    def run(self, step: Step) -> None:
        if step.command == ". .venv/bin/activate":
            assert (ROOT / ".venv" / "bin" / "activate").exists() or BIN.exists()
            return
        if step.command == "hafo dev":
            self.dev = DevProcess(env=self.base_env())
            self.dev_processes.append(self.dev)
            self.env = {**self.dev.ready(), "PATH": self.base_env()["PATH"]}
            return
        if step.command.startswith("export "):
            assert self.dev is not None, "export before hafo dev"
            assert step.command.startswith("export HAFO_ETCD=") and "HAFO_DEV=" in step.command
            return
        command = self.substitute(step.command)
        argv = shlex.split(command)
        assert argv[0] == "hafo", f"not a hafo command: {command!r}"
        if argv[1:3] == ["dev", "fault"]:
            self.check_gpu_claim(argv)
        if argv[1:3] in (["dev", "power-off"], ["dev", "fault"]):
            self.disrupted = placement(self.env)
        if step.interactive:
            self.run_until_ctrl_c(command, argv)
        else:
            done = subprocess.run([str(BIN / "hafo"), *argv[1:]], capture_output=True,
                                  text=True, timeout=60, env=self.env, cwd=ROOT)
            assert done.returncode == 0, f"{command}: {done.returncode}\n{done.stderr}"
            self.check_output(argv, done.stdout)

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HAFO_")}
        env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
        return env

    def check_gpu_claim(self, argv: list[str]) -> None:
        """The README says counter holds GPU 0 of its new node: true?"""
        node, gpu = argv[3], int(argv[argv.index("--gpu") + 1])
        done = hafo("nodes", "--json", env=self.env)
        held = [g["index"] for n in json.loads(done.stdout) if n["name"] == node
                for g in n["gpus"] if (g["allocated_to"] or "").startswith("counter-")]
        assert held == [gpu], f"counter holds GPUs {held} of {node}, the README says {gpu}"

    def check_output(self, argv: list[str], out: str) -> None:
        """`hafo events`, `hafo logs --all` and `hafo show` show what the README's comments
        promise."""
        if argv[1] == "logs" and "--all" in argv:
            headers = [line for line in out.splitlines() if line.startswith("==> ")]
            assert len(headers) >= 2, f"one epoch's output only:\n{out[-2000:]}"
            return
        if argv[1] == "show":
            assert "node down" in out, out
            return
        if argv[1] != "events":
            return
        if "<new-node>" in self.names:
            assert f"node {self.names['<new-node>']} is unhealthy" in out, out
        elif "<node>" in self.names:
            assert f"node {self.names['<node>']} is down" in out, out

    def run_until_ctrl_c(self, command: str, argv: list[str]) -> None:
        wait = (lambda: self.wait_for_promise(command)) if "--watch" in argv else None
        run_until_ctrl_c(command, [str(BIN / "hafo"), *argv[1:]], self.env, ROOT,
                         FOLLOW_SECONDS, before=wait)

    def wait_for_promise(self, command: str) -> None:
        """A `--watch` is interrupted once counter runs (elsewhere than before the last
        power-off or fault)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            view = counter(self.env)
            where = (view["node"], tuple(view["gpus"]))
            if view["state"] == "running" and where != self.disrupted:
                self.disrupted = None
                return
            assert time.monotonic() < deadline, f"{command}: counter did not run again: {view}"
            time.sleep(0.5)

    def stop(self) -> None:
        assert self.dev is not None, "the README path never starts hafo dev"
        pids = set(self.dev.track())
        base = Path(self.env["HAFO_DEV"])
        assert self.dev.stop(signal.SIGINT) == 0, self.dev.output
        assert_all_gone(pids)
        assert not base.exists()


def test_readme_newcomer_path(dev_processes: list[DevProcess]) -> None:
    source = Path(os.environ.get("HAFO_README", ROOT / "README.md"))
    steps = readme_steps(source.read_text())
    commands = [s.command for s in steps]
    assert "hafo dev" in commands and "hafo submit examples/counter.yaml" in commands
    walk = Walk(dev_processes)
    for step in steps:
        walk.run(step)
    assert walk.names.keys() == {"<node>", "<new-node>"}
    assert counter(walk.env)["state"] == "running"
    walk.stop()
