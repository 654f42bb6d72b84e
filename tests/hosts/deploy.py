"""Deploying hafo onto a lab's machines with the real playbooks, over SSH.

- ``wheelhouse()``: hafo's wheel built from the checkout (optionally with another version),
  beside the wheels of its dependencies (cached; the machines have no package index).
- ``write_inventory()``: the inventory of a lab: every machine an etcd member and an agent
  with simulated GPUs, the first two controllers.
- ``Ansible.playbook()``: ``ansible-playbook`` with this virtualenv's Ansible, its caches and
  SSH control sockets in the run folder; ``close()`` stops the SSH masters by their sockets.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tests.hosts.image import cache_dir
from tests.hosts.lab import Lab

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent

RECAP_RE = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
                      r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)", re.M)

#: Inventory groups of a lab (machines m1, m2, m3, ...).
CONTROLLERS = 2


def _dependencies() -> list[str]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def _dependency_wheels() -> Path:
    """Wheels of hafo's dependencies for this Python, from the package index once, then cached
    (keyed by the dependency list and the Python version)."""
    deps = _dependencies()
    key = hashlib.sha256(f"{sys.version_info[:2]} {deps}".encode()).hexdigest()[:12]
    folder = cache_dir() / f"wheels-{key}"
    if (folder / ".complete").exists():
        return folder
    building = folder.with_name(folder.name + f".build-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    result = subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "-q", "--wheel-dir",
                             str(building), *deps], capture_output=True, text=True,
                            timeout=900, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip wheel failed:\n{result.stderr[-3000:]}")
    (building / ".complete").write_text("")
    shutil.rmtree(folder, ignore_errors=True)
    building.rename(folder)
    return folder


def _build_hafo_wheel(dest: Path, version: str | None) -> None:
    """hafo's wheel from the checkout into ``dest``; with ``version``, from a copy of the
    sources whose version (pyproject and hafo.__version__) reads ``version``."""
    source = REPO
    if version is not None:
        source = dest / f"src-{version}"
        shutil.rmtree(source, ignore_errors=True)
        shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
            ".venv", ".git", "tests", "node_modules", "*.egg-info", "build", "__pycache__",
            ".mypy_cache", ".ruff_cache", "ansible", "benchmarks"))
        current = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        for path in (source / "pyproject.toml", source / "hafo/__init__.py"):
            path.write_text(path.read_text().replace(f'"{current}"', f'"{version}"', 1))
    subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(dest), str(source)],
                   check=True, timeout=300, capture_output=True)
    if version is not None:
        shutil.rmtree(source, ignore_errors=True)


def wheelhouse(dest: Path, *versions: str | None) -> Path:
    """A folder with hafo's wheel (one per version asked; None: the checkout's) and its
    dependencies' wheels."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in _dependency_wheels().glob("*.whl"):
        if not (dest / wheel.name).exists():
            shutil.copy2(wheel, dest / wheel.name)
    for version in versions or (None,):
        _build_hafo_wheel(dest, version)
    return dest


def write_inventory(lab: Lab, path: Path) -> Path:
    """An INI inventory: every machine is an etcd member and an agent, the first
    ``CONTROLLERS`` run a controller."""
    names = list(lab.machines)
    lines = ["[etcd]"]
    lines += [f"{n} ansible_host={lab[n].address} hafo_address={lab[n].address}" for n in names]
    lines += ["", "[hafo_controllers]", *names[:CONTROLLERS]]
    lines += ["", "[hafo_agents]", *names]
    lines += ["", "[all:vars]", "ansible_user=root",
              f"ansible_ssh_private_key_file={lab.key}",
              "ansible_python_interpreter=/usr/bin/python3"]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Recap:
    """One ``PLAY RECAP`` line."""

    ok: int
    changed: int
    unreachable: int
    failed: int


@dataclass(frozen=True)
class PlaybookRun:
    """What one ``ansible-playbook`` run did."""

    returncode: int
    output: str
    recap: dict[str, Recap]

    @property
    def changed(self) -> int:
        """Tasks changed on all hosts together."""
        return sum(r.changed for r in self.recap.values())

    def tail(self, chars: int = 6000) -> str:
        """The end of the output, for assertion messages."""
        return self.output[-chars:]


class Ansible:
    """ansible-playbook against one lab, its state in ``home``."""

    def __init__(self, home: Path, inventory: Path, extra_vars: dict[str, object]) -> None:
        self.home = home
        self.inventory = inventory
        self.vars_file = home / "vars.json"
        home.mkdir(parents=True, exist_ok=True)
        self.vars_file.write_text(json.dumps(extra_vars, indent=2))
        self.control_dir = home / "cp"
        self.control_dir.mkdir(exist_ok=True)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
        home = self.home
        env.update({
            "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
            "ANSIBLE_LOCAL_TEMP": str(home / ".ansible-tmp"),
            "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_dir),
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=120s "
                                "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "NO_COLOR": "1",
        })
        return env

    def playbook(self, name: str, *extra: str, timeout: float = 600) -> PlaybookRun:
        """Run ``ansible/<name>`` over SSH; returns its recap (a failed run is returned, not
        raised: the caller asserts with the output)."""
        result = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(self.inventory), "-e",
             f"@{self.vars_file}", *extra, name],
            cwd=ANSIBLE_DIR, env=self._env(), capture_output=True, text=True,
            timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        output = result.stdout + result.stderr
        recap = {m["host"]: Recap(int(m["ok"]), int(m["changed"]), int(m["unreachable"]),
                                  int(m["failed"])) for m in RECAP_RE.finditer(output)}
        (self.home / f"{name}.log").open("a").write(output)
        return PlaybookRun(result.returncode, output, recap)

    def close(self) -> None:
        """Stop the SSH control masters Ansible left (by their sockets)."""
        for socket in self.control_dir.iterdir():
            subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "dummy"],
                           capture_output=True, timeout=10, check=False)
