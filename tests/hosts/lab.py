"""Machines with systemd as PID 1 on a private bridge: ``systemd-nspawn`` containers booted
from overlays of the cached image (tests/hosts/image.py).

A ``Lab`` owns one bridge (its own name and a free 10.231.K.0/24 subnet; the host takes .1),
an SSH key made for the run, and its machines. Each ``Machine`` boots from an overlay whose
upper layer is its disk: ``power_off()`` SIGKILLs the machine's PID 1, which ends every process
of its PID namespace at once (power loss, no shutdown), and ``boot()`` starts it again from the
same disk. Nothing is routed beyond the bridge: no forwarding, no NAT, no default route inside.
``close()`` powers every machine off, unmounts the overlays, deletes the bridge and the run
folder; it is safe to call twice and after a failed start.

cgroups: like a real machine, each machine has a cgroup tree of its own with cgroup v2 mounted
at /sys/fs/cgroup (its agent's unit delegates a subtree to it, ``Delegate=yes``). Without a
systemd on the host to give it a scope, every ``systemd-nspawn`` would put its container in
the same ``/payload`` cgroup of the host's hierarchies, so that the three machines' systemds
would share one cgroup tree; and on a host in the hybrid layout (cgroup2 only at
/sys/fs/cgroup/unified) the containers would get the hybrid layout too. So each machine's
nspawn starts in a cgroup of its own, ``hafo-lab.<bridge>/<machine>`` in every hierarchy
nspawn uses (cgroup2 and v1's name=systemd, where mounted), and with
``SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1``. A machine's cgroups are removed when it is powered off
(a real power cut leaves no cgroup behind either).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SSH_OPTIONS = ("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.231.K.0/24 that no interface of the host uses."""
    used = _run("ip", "-4", "-o", "addr", "show").stdout
    for k in range(1, 255):
        net = ipaddress.IPv4Network(f"10.231.{k}.0/24")
        if f"10.231.{k}." not in used:
            return net
    raise RuntimeError("no free 10.231.K.0/24 subnet")


def _host_cgroup_mounts() -> list[Path]:
    """The host's cgroup hierarchies that systemd-nspawn places its container in: cgroup2 and
    v1's name=systemd, where mounted (from /proc/self/mountinfo, hierarchy roots only)."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) < 5 or fields[3] != "/" or not kind:
            continue
        if kind[0] == "cgroup2" or (kind[0] == "cgroup" and len(kind) > 2
                                    and "name=systemd" in kind[2].split(",")):
            mounts.append(Path(fields[4]))
    return mounts


def _remove_cgroup_tree(top: Path, timeout: float = 10) -> bool:
    """rmdir ``top`` and everything below it, deepest first; a cgroup whose last processes
    are still dying is retried until ``timeout``. True once gone."""
    deadline = time.monotonic() + timeout
    while True:
        if not top.exists():
            return True
        dirs = sorted((Path(d) for d, _subdirs, _files in os.walk(top)),
                      key=lambda p: len(p.parts), reverse=True)
        for path in dirs:
            with contextlib.suppress(OSError):
                path.rmdir()
        if not top.exists():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def _joiner(procs: list[str]) -> Callable[[], None]:
    """Between fork and exec: move the child into each of the machine's cgroups."""
    def join() -> None:
        for path in procs:
            with open(path, "w") as handle:
                handle.write("0")
    return join


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Machine:
    """One booted (or powered-off) machine of a lab."""

    def __init__(self, lab: Lab, name: str, address: str) -> None:
        self.lab = lab
        self.name = name
        self.address = address
        self.dir = lab.dir / name
        self.root = self.dir / "root"
        self.process: subprocess.Popen[bytes] | None = None
        self.init_pid: int | None = None
        self.boots = 0

    # --- disk -------------------------------------------------------------------------------
    def _mount(self) -> None:
        if os.path.ismount(self.root):
            return
        for sub in ("upper", "work", "root"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={self.lab.image},upperdir={self.dir / 'upper'},"
             f"workdir={self.dir / 'work'}", str(self.root))

    def _write_identity(self) -> None:
        root = self.root
        (root / "etc/hostname").write_text(f"{self.name}\n")
        network = root / "etc/systemd/network"
        network.mkdir(parents=True, exist_ok=True)
        # 10- sorts before systemd's own 80-container-host0.network (DHCP): ours wins.
        (network / "10-host0.network").write_text(
            f"[Match]\nName=host0\n\n[Network]\nAddress={self.address}/"
            f"{self.lab.subnet.prefixlen}\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n")
        hosts = ["127.0.0.1 localhost", f"127.0.1.1 {self.name}"]
        hosts += [f"{m.address} {m.name}" for m in self.lab.machines.values()]
        (root / "etc/hosts").write_text("\n".join(hosts) + "\n")
        ssh = root / "root/.ssh"
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        (ssh / "authorized_keys").write_text(self.lab.public_key)
        (ssh / "authorized_keys").chmod(0o600)

    # --- cgroups ----------------------------------------------------------------------------
    @property
    def cgroups(self) -> list[Path]:
        """The machine's cgroup in each of the host's hierarchies that nspawn uses."""
        return [mount / self.lab.cgroup_name / self.name for mount in _host_cgroup_mounts()]

    def _remove_cgroups(self) -> None:
        for path in self.cgroups:
            _remove_cgroup_tree(path)

    # --- power ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the machine's container is up."""
        return self.process is not None and self.process.poll() is None

    def boot(self, wait: bool = True) -> None:
        """Start the machine (systemd as PID 1) and, with ``wait``, wait until SSH answers."""
        if self.running:
            return
        self._mount()
        self._write_identity()
        self._remove_cgroups()  # left by a failed start: a machine boots with none
        procs = []
        for path in self.cgroups:
            path.mkdir(parents=True, exist_ok=True)
            procs.append(str(path / "cgroup.procs"))
        log = (self.dir / "console.log").open("ab")
        self.process = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "-D", str(self.root), f"--machine={self.name}",
             "--register=no", "--keep-unit", "--boot", f"--network-bridge={self.lab.bridge}",
             "--console=passive", "--link-journal=no"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"},
            preexec_fn=_joiner(procs))  # nspawn makes its payload cgroups below them
        log.close()
        self.boots += 1
        self.init_pid = self._find_init()
        if wait:
            self.wait_ssh()

    def _find_init(self, timeout: float = 20) -> int:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name}: systemd-nspawn exited "
                                   f"({self.process.returncode}); see {self.dir}/console.log")
            for child in _children(self.process.pid):
                if _comm(child) == "systemd":
                    return child
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: systemd did not start within {timeout} s")

    def wait_ssh(self, timeout: float = 60) -> None:
        """Wait until the machine accepts an SSH login."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.ssh("true", check=False, timeout=10)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline or not self.running:
                raise RuntimeError(f"{self.name}: no SSH at {self.address} "
                                   f"({result.stderr.strip()}); see {self.dir}/console.log")
            time.sleep(0.3)

    def power_off(self) -> float:
        """Cut the power: SIGKILL the machine's PID 1, which kills its whole PID namespace
        (agent, guards, workloads, etcd, controller, sshd) at once; its network link goes
        with it. Returns the CLOCK_BOOTTIME second it happened."""
        at = time.clock_gettime(time.CLOCK_BOOTTIME)
        if self.init_pid is not None and self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)
        if self.process is not None:
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None
        self.init_pid = None
        self._remove_cgroups()
        return at

    # --- commands ---------------------------------------------------------------------------
    def ssh(self, command: str, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``command`` as root on the machine over SSH."""
        result = subprocess.run(
            ["ssh", "-i", str(self.lab.key), *SSH_OPTIONS, f"root@{self.address}", command],
            capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"{self.name}: `{command}` failed ({result.returncode}): "
                               f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def in_netns(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the machine's own ``argv`` in its mount and network namespaces, from the host
        (``nsenter``): works while the machine's network is cut."""
        assert self.init_pid is not None, f"{self.name} is powered off"
        return _run("nsenter", "-t", str(self.init_pid), "-m", "-n", *argv, check=check)

    def pid_namespace(self) -> int | None:
        """The inode of the machine's PID namespace (None when powered off)."""
        if self.init_pid is None:
            return None
        try:
            return os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino
        except OSError:
            return None

    def cleanup(self) -> None:
        """Power off and unmount the disk."""
        self.power_off()
        if os.path.ismount(self.root) and \
                _run("umount", str(self.root), check=False).returncode != 0:
            _run("umount", "-l", str(self.root), check=False)


class Lab:
    """A bridge, an SSH key and named machines booted from ``image``."""

    def __init__(self, run_dir: Path, image: Path, names: Sequence[str]) -> None:
        self.dir = run_dir
        self.image = image
        self.bridge = f"hafobr{os.getpid() % 100000}"
        #: The parent of the machines' cgroups in each host hierarchy.
        self.cgroup_name = f"hafo-lab.{self.bridge}"
        self.subnet = _free_subnet()
        hosts = list(self.subnet.hosts())
        self.host_address = str(hosts[0])
        self.key = run_dir / "id_ed25519"
        self.public_key = ""
        self.machines = {name: Machine(self, name, str(hosts[10 + i]))
                         for i, name in enumerate(names)}
        self._bridge_made = False

    def __getitem__(self, name: str) -> Machine:
        return self.machines[name]

    def start(self) -> None:
        """Make the key and the bridge, then boot every machine (in parallel)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hafo-test-hosts",
                 "-f", str(self.key))
        self.public_key = self.key.with_suffix(".pub").read_text()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _run("ip", "addr", "add", f"{self.host_address}/{self.subnet.prefixlen}", "dev",
             self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for machine in self.machines.values():
            machine.boot(wait=False)
        for machine in self.machines.values():
            machine.wait_ssh()

    def close(self) -> None:
        """Power everything off and remove the bridge, the overlays and the run folder."""
        for machine in self.machines.values():
            machine.cleanup()
        for mount in _host_cgroup_mounts():
            _remove_cgroup_tree(mount / self.cgroup_name, timeout=2)
        if self._bridge_made:
            _run("ip", "link", "del", self.bridge, check=False)
            self._bridge_made = False
        shutil.rmtree(self.dir, ignore_errors=True)
