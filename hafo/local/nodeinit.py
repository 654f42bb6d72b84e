"""The "power supply" of a simulated node: its init, which runs the agent.

A simulated node is as close to a machine as one host allows. With ``--namespaces`` (root), the
node gets what a machine that boots gets:
- its own PID namespace: this process forks the node's PID 1, and every process of the node
  is numbered from 1 again at each power-on (a recorded pid of an earlier boot belongs to
  someone else after the next one, as on a real machine);
- its own mount namespace with its own ``/proc`` (the node sees only its processes) and a boot
  id of its own at ``/proc/sys/kernel/random/boot_id``, new at every power-on;
- its own time namespace: CLOCK_MONOTONIC and CLOCK_BOOTTIME start near zero at every
  power-on, as after a reboot (``HAFO_LOCAL_TIMENS=0`` in the environment: the host's clocks);
- with ``--cgroup PATH``, its own cgroup (v2), in which the agent makes its instances'
  cgroups; the local cluster removes it at power-off, as a reboot empties the hierarchy.

The node's PID 1 is a reaper (every orphan of the node is re-parented to it), so the local
cluster can cut a node's power by killing exactly its tree (or its cgroup), by pid. If the agent
exits, the node stays powered (its guards keep running) until this process is told to stop;
SIGUSR1 starts the agent again if it is not running (as systemd's Restart= would). Without
``--namespaces``, or where the kernel refuses them, the node runs in the host's namespaces
(and says so on stderr). Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWTIME = 0x00000080
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
BOOT_ID = "/proc/sys/kernel/random/boot_id"
BOOT_CLOCK_START = 10  # seconds on the node's monotonic clock at power-on

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, flags, None), f"mount {target}")


def join_cgroup(path: Path) -> None:
    """Create the node's cgroup and move this process into it."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.procs").write_text("0")


def _set_clocks() -> None:
    """The node's clocks start near zero (children of this process, in its time namespace)."""
    monotonic = int(time.clock_gettime(time.CLOCK_MONOTONIC))
    boottime = int(time.clock_gettime(time.CLOCK_BOOTTIME))
    with open("/proc/self/timens_offsets", "w") as offsets:
        offsets.write(f"monotonic {BOOT_CLOCK_START - monotonic} 0\n"
                      f"boottime {BOOT_CLOCK_START - boottime} 0\n")


def enter_namespaces() -> bool:
    """New PID, mount and time namespaces for the children of this process (True), or False
    where the kernel refuses (not root): the node then runs in the host's."""
    try:
        if os.environ.get("HAFO_LOCAL_TIMENS") == "0":
            raise OSError("time namespace turned off")
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWTIME), "unshare")
    except OSError:
        try:  # a kernel without time namespaces (before 5.6)
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare")
        except OSError as exc:
            print(f"nodeinit: no namespaces ({exc}): the node shares the host's PID space",
                  file=sys.stderr)
            return False
        print("nodeinit: no time namespace: the node's clocks are the host's", file=sys.stderr)
        return True
    try:
        _set_clocks()
    except OSError as exc:
        print(f"nodeinit: the node's clocks are the host's ({exc})", file=sys.stderr)
    return True


def boot(boot_id_file: Path) -> None:
    """In the node's PID 1: a private mount tree, its own /proc and a new boot id."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    boot_id_file.parent.mkdir(parents=True, exist_ok=True)
    boot_id_file.write_text(f"{uuid.uuid4()}\n")
    _mount(str(boot_id_file), BOOT_ID, None, MS_BIND)


def run_init(pidfile: Path, argv: list[str]) -> int:
    """Start the agent and reap every orphan until told to stop (SIGTERM); SIGUSR1 starts a
    dead agent again. ``pidfile`` gets the agent's pid (in the node's numbering)."""
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


def _forward_to(child: int) -> None:
    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, forward)


def enter(target: int, cgroup: Path | None, argv: list[str]) -> int:
    """Run ``argv`` on a running node as one of its own processes (a second agent started by
    hand on that machine): in the cgroup and the mount, time and PID namespaces of the node's
    process ``target`` (a host pid). Unlike ``nsenter``, signals to this process reach the
    command, and this process ends with it."""
    if cgroup is not None:
        join_cgroup(cgroup)
    kinds = (("mnt", CLONE_NEWNS), ("time", CLONE_NEWTIME), ("pid", CLONE_NEWPID))
    fds = [(os.open(f"/proc/{target}/ns/{name}", os.O_RDONLY), flag) for name, flag in kinds]
    for fd, flag in fds:  # all opened first: the node's /proc has no such pid
        _check(_libc.setns(fd, flag), "setns")
        os.close(fd)
    child = os.fork()  # born in the node's PID and time namespaces
    if child == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    _forward_to(child)
    while True:
        with contextlib.suppress(InterruptedError):
            _pid, status = os.waitpid(child, 0)
            return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    """``python -m hafo.local.nodeinit PIDFILE [--cgroup PATH] [--boot-id-file PATH] -- argv``
    (``--boot-id-file``: run in namespaces of the node's own, with that file as boot id);
    ``python -m hafo.local.nodeinit --enter HOST_PID [--cgroup PATH] -- argv``: run ``argv``
    on the running node of that process (``enter``)."""
    split = argv.index("--")
    if argv[0] == "--enter":
        values = dict(zip(argv[:split:2], argv[1:split:2], strict=True))
        cgroup = values.get("--cgroup")
        return enter(int(values["--enter"]), Path(cgroup) if cgroup else None,
                     argv[split + 1:])
    pidfile, options, command = Path(argv[0]), argv[1:split], argv[split + 1:]
    values = dict(zip(options[::2], options[1::2], strict=True))
    if "--cgroup" in values:
        try:
            join_cgroup(Path(values["--cgroup"]))
        except OSError as exc:
            print(f"nodeinit: no cgroup of its own ({exc})", file=sys.stderr)
    if "--boot-id-file" not in values or not enter_namespaces():
        return run_init(pidfile, command)
    child = os.fork()
    if child == 0:  # the node's PID 1
        code = 1
        try:
            boot(Path(values["--boot-id-file"]))
            code = run_init(pidfile, command)
        except BaseException as exc:
            print(f"nodeinit: the node did not boot: {exc!r}", file=sys.stderr)
        finally:
            os._exit(code)
    _forward_to(child)
    while True:
        with contextlib.suppress(InterruptedError):
            _pid, status = os.waitpid(child, 0)
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
