"""Starts, stops and reports the instances of one node, through their guards.

Desired instances are the assignments naming this node (workload at an epoch). The supervisor
starts a guard for a desired instance it has never started, stops guards of instances that are
no longer desired, and reports each instance's state to etcd under the node's lease.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from hafo.agent import cgroups, procid
from hafo.agent.cgroups import CgroupRoot
from hafo.agent.fencefile import FENCE_FILE
from hafo.agent.instances import (
    SUBMISSION_FILE,
    GuardState,
    InstanceKey,
    instance_dir,
    list_instances,
    progress_dir,
    read_guard_state,
    read_launch,
    write_json_atomic,
)
from hafo.agent.outputlog import keep_ended
from hafo.agent.ports import NoFreePort, choose_ports, port_env, read_ports
from hafo.agent.procid import ProcessId
from hafo.agent.proctree import kill_instance
from hafo.agent.rendezvous import GANG_DEFAULTS, gang_env, preflight_options
from hafo.agent.scratch import kept_caches, make_tmpdir, remove_tmpdir
from hafo.agent.warm_member import ask_handover, ask_park
from hafo.checkpoint.memory_store import ADDRESS_ENV, MEMORY_DIR_ENV, MemoryStore
from hafo.checkpoint.sharded import list_all_checkpoints
from hafo.decisions.handover import relaunch_refusal
from hafo.model.clocks import since_boot
from hafo.model.cluster import (
    Assignment,
    CheckpointInfo,
    InstanceEnd,
    InstanceStatus,
    Submission,
)
from hafo.model.config import NodeLogs, PortRange
from hafo.model.exits import bounded_tail
from hafo.model.names import checkpoint_dir as workload_checkpoint_dir
from hafo.model.output import MIB
from hafo.model.paths import DEFAULT_MEMORY_DIR
from hafo.model.preflight import MAX_REPORT_BYTES, Preflight, parse_preflight
from hafo.model.progress import PROGRESS_DIR_ENV
from hafo.model.warm import STANDBY_ENV, WARM_DIR_ENV

log = structlog.get_logger("hafo.agent")
#: Seconds a workload's RAM-tier snapshots stay on a node with none of its instances.
MEMORY_KEEP_IDLE = 600.0

#: A launched instance whose guard wrote no state within this long (the boot clock) did not
#: start.
GUARD_START_WAIT = 10.0

#: The agent's own systemd variables (sd_notify socket, watchdog, socket activation): a
#: workload must not inherit them, or its sd_notify calls would speak for the agent's unit.
SERVICE_MANAGER_ENV = frozenset({"NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", "LISTEN_PID",
                                 "LISTEN_FDS", "LISTEN_FDNAMES"})


def reap_children() -> None:
    """Collect exited children (guards report through their files, not exit codes)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@dataclass
class Supervisor:
    """Instance bookkeeping for one node."""

    node: str
    state_dir: Path
    checkpoint_root: Path
    port_range: PortRange = field(default_factory=PortRange)
    logs: NodeLogs = field(default_factory=NodeLogs)
    #: where instances' cgroups are made (the agent passes ``CgroupRoot.detect()``); without
    #: one, an instance's processes are found by tree and environment (hafo.agent.proctree)
    containment: CgroupRoot = field(default_factory=lambda: CgroupRoot(None, "not asked for"))
    #: told of each write into the state directory that failed (read-only, full): what was
    #: not written, and the error; the supervisor goes on from what it keeps in memory
    write_failed: Callable[[str, OSError], None] | None = None
    #: seconds since boot (``hafo.model.clocks.since_boot``): how long a guard has had to
    #: start is measured on it, never on the wall clock or a file's mtime
    boot_clock: Callable[[], float] = since_boot
    #: ``node.memory_dir``: each workload's RAM-tier snapshots, ``<memory_root>/<workload>``
    memory_root: Path = Path(DEFAULT_MEMORY_DIR)
    #: where this node's peers reach it (``HAFO_NODE_ADDRESS``; empty: not told)
    address: str = ""

    def __post_init__(self) -> None:
        self._launched: dict[InstanceKey, float] = {}  # boot clock at launch (or first sight)
        self._ports: dict[InstanceKey, dict[str, int]] = {}
        self._launches: dict[InstanceKey, dict[str, object]] = {}
        self._preflights: dict[InstanceKey, Preflight] = {}  # reports read (final once written)
        self._unrecorded: dict[InstanceKey, GuardState] = {}  # exits not written to disk yet
        self._forgotten: set[InstanceKey] = set()  # forgotten, but the directory stays
        self._memory_idle: dict[str, float] = {}  # workload -> boot clock since no instance
        self.stopping: set[InstanceKey] = set()
        self.stopping_now: set[InstanceKey] = set()
        self.parking: set[InstanceKey] = set()  # asked to park (warm gang members)
        # workload -> (monotonic and wall-clock time of the reading, the checkpoint read)
        self._checkpoint_cache: dict[str, tuple[float, float, CheckpointInfo | None]] = {}

    # -- state --------------------------------------------------------------------------

    def states(self) -> dict[InstanceKey, GuardState]:
        """Every instance on disk with its guard's state. An instance whose guard is gone is
        killed whole and marked exited; one recorded in an earlier boot is marked ended by
        the reboot and never signalled; one whose processes are not all dead yet (its cgroup
        not empty) reads as ``stopping``, so that no new epoch starts beside them. With a
        state directory that cannot be written, what could not be recorded is kept in memory
        (and written once it can be)."""
        out: dict[InstanceKey, GuardState] = {}
        present = set(list_instances(self.state_dir))
        self._forgotten &= present
        for key in sorted(present - self._forgotten, key=lambda k: k.dirname):
            state = self._state_of(key)
            if state is None:
                continue  # removed meanwhile
            if state.state == "exited" and not self._kill_leftovers(key):
                state = dataclasses.replace(state, state="stopping")
            out[key] = state
        return out

    @property
    def pending_writes(self) -> bool:
        """Something is known in memory only (the state directory refused a write)."""
        return bool(self._unrecorded or self._forgotten)

    def _state_of(self, key: InstanceKey) -> GuardState | None:
        path = instance_dir(self.state_dir, key)
        unrecorded = self._unrecorded.get(key)
        if unrecorded is not None:
            self._record_exit(key, unrecorded)  # again: the directory may take it now
            return unrecorded
        state = read_guard_state(path)
        if state is None:
            try:
                launched = (path / "launch.json").exists()
            except OSError:
                return None
            if not launched or self._launch_age(key, path) < GUARD_START_WAIT:
                return GuardState(None, None, "starting", None, None, None, "")
            # the guard never wrote its state: it did not start
            self._launched.pop(key, None)
            return self._mark_exited(key, state, "guard did not start", InstanceEnd.GUARD_LOST)
        if state.state == "exited":
            return state
        if state.guard is not None and not state.guard.this_boot:
            return self._mark_exited(key, state, "ended by a reboot of the node",
                                     InstanceEnd.FENCED, exit_code=-9)
        if self._guard_alive(key, state):
            return state
        # the workload may be orphaned: never leave any of its processes running
        if not self._kill_instance(key, state):
            return dataclasses.replace(state, state="stopping")
        return self._mark_exited(key, state, "guard died", InstanceEnd.GUARD_LOST, exit_code=-9)

    def _launch_age(self, key: InstanceKey, path: Path) -> float:
        """Seconds since the instance was launched, on the boot clock: remembered at launch;
        after an agent restart, from the launch file's ``launched_boottime`` of this boot
        (another boot's launch: its guard is gone); a launch file without it (an older
        agent's) counts from its first sight. Never a file's mtime against the wall clock:
        a step of the wall clock would make a starting guard one that did not start."""
        now = self.boot_clock()
        at = self._launched.get(key)
        if at is None:
            launch = read_launch(path) or {}
            stamp, boot = launch.get("launched_boottime"), launch.get("boot")
            if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) \
                    and isinstance(boot, str) and boot:
                if boot != procid.boot_id():
                    return float("inf")
                at = float(stamp)
            else:
                at = now
            self._launched[key] = at
        return now - at

    def _launch_of(self, key: InstanceKey) -> dict[str, object] | None:
        """The instance's launch file, read once."""
        launch = self._launches.get(key)
        if launch is None:
            launch = read_launch(instance_dir(self.state_dir, key))
            if launch is not None:
                self._launches[key] = launch
        return launch

    def preflight_of(self, key: InstanceKey) -> Preflight | None:
        """The pre-flight report of an instance launched with one (``hafo.model.preflight``),
        once its pre-flight wrote it (read at most ``MAX_REPORT_BYTES``); None otherwise."""
        found = self._preflights.get(key)
        if found is not None:
            return found
        options = (self._launch_of(key) or {}).get("preflight")
        if not isinstance(options, dict) or not isinstance(options.get("out"), str):
            return None
        out = Path(options["out"])
        if out.parent != progress_dir(instance_dir(self.state_dir, key)):
            return None  # an edited launch file's path is never read
        try:
            with out.open(encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_REPORT_BYTES + 1)
        except OSError:
            return None
        report = parse_preflight(text)
        if report is not None:
            self._preflights[key] = report
        return report

    def cgroup_of(self, key: InstanceKey) -> Path | None:
        """The instance's cgroup, if it was launched in one: the path this agent would give
        it, and only if its launch file names that same path (a path an edited launch file
        names is never used)."""
        path = self.containment.of(self.node, key.dirname)
        if path is None:
            return None
        launch = self._launch_of(key)
        if launch is None:
            return None
        return path if launch.get("cgroup") == str(path) else None

    def _guard_identity(self, key: InstanceKey, state: GuardState) -> ProcessId | None:
        """The guard's identity: as it recorded it; for a record of an older guard (a bare
        pid), the process at that pid only if it is that instance's ``hafo guard``."""
        if state.guard is not None or not state.guard_pid:
            return state.guard
        try:
            argv = (Path("/proc") / str(state.guard_pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        started_as_guard = b"guard" in argv or b"hafo.agent.guard" in argv
        if started_as_guard and str(instance_dir(self.state_dir, key)).encode() in argv:
            return procid.identify(state.guard_pid)
        return None

    def _guard_alive(self, key: InstanceKey, state: GuardState) -> bool:
        return procid.is_alive(self._guard_identity(key, state))

    def _kill_instance(self, key: InstanceKey, state: GuardState,
                       guard: ProcessId | None = None) -> bool:
        """SIGKILL every process of the instance: its cgroup, until empty (True once empty);
        without one, its workload's process group (identity checked), the live guard's
        descendants and the processes its environment names."""
        cgroup = self.cgroup_of(key)
        if cgroup is not None:
            return cgroups.kill(cgroup)
        if procid.is_alive(state.workload):
            assert state.workload is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                # a live process of ours started its own session: its group is ours too
                os.killpg(state.workload.pid, signal.SIGKILL)
        kill_instance(key.workload, self._env_epoch(key), self.node,
                      guard.pid if procid.is_alive(guard) and guard is not None else None)
        return True

    def _env_epoch(self, key: InstanceKey) -> int:
        """The ``HAFO_EPOCH`` in the environment of the instance's processes: its epoch, or
        for a warm member handed over, the epoch its process was started for."""
        launch = self._launch_of(key) or {}
        epoch = launch.get("env_epoch", key.epoch)
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else key.epoch

    def _kill_leftovers(self, key: InstanceKey) -> bool:
        """An exited instance's cgroup must be empty: kill what is left (a process that
        left the workload's tree); True when nothing is left."""
        cgroup = self.cgroup_of(key)
        if cgroup is None or not cgroups.populated(cgroup):
            return True
        log.warning("processes of an ended instance still ran: killed", workload=key.workload,
                    node=self.node, epoch=key.epoch, pids=cgroups.members(cgroup))
        return cgroups.kill(cgroup, wait=1.0)

    def _mark_exited(self, key: InstanceKey, state: GuardState | None, reason: str,
                     ended: InstanceEnd, exit_code: int | None = None) -> GuardState:
        """Record the instance as exited (by the agent: its guard is gone or never was)."""
        exited = GuardState(state.guard_pid if state else None, state.pid if state else None,
                            "exited", exit_code, None, time.time(), reason, ended=ended,
                            guard=state.guard if state else None,
                            workload=state.workload if state else None)
        self._record_exit(key, exited)
        return exited

    def _record_exit(self, key: InstanceKey, exited: GuardState) -> None:
        """Write an exit to the instance's state.json; kept in memory if it cannot be."""
        data = {"guard_pid": exited.guard_pid, "pid": exited.pid, "state": "exited",
                "exit_code": exited.exit_code,
                "guard": exited.guard.to_dict() if exited.guard else None,
                "workload": exited.workload.to_dict() if exited.workload else None,
                "started_at": None, "finished_at": exited.finished_at, "reason": exited.reason,
                "ended": exited.ended.value if exited.ended else None}
        try:
            write_json_atomic(instance_dir(self.state_dir, key) / "state.json", data)
        except OSError as exc:
            self._unrecorded[key] = exited
            self._failed("instance record", exc)
            return
        self._unrecorded.pop(key, None)

    def _failed(self, what: str, exc: OSError) -> None:
        if self.write_failed is not None:
            self.write_failed(what, exc)
        else:
            log.error("state directory not written", what=what, node=self.node, error=str(exc))

    # -- actions ------------------------------------------------------------------------

    def launch(self, assignment: Assignment, submission: Submission, gpu_ids: list[str],
               service: Submission | None = None) -> None:
        """Write the launch file and start the guard for one instance (ValidationError for a
        workload id no submit makes: no path is built from it). ``service``: a replica's
        service's submission, kept with the instance's own and its assignment in
        ``submission.json`` (what ``hafo recover --from-agents`` rebuilds from)."""
        path = self._prepare(assignment, submission, gpu_ids, service)
        if path is None:
            return
        with open(path / "guard.log", "ab") as guard_log:
            # the module itself, not ``hafo guard``: the CLI's parser costs 0.1 s at each start
            subprocess.Popen([sys.executable, "-m", "hafo.agent.guard", str(path)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=guard_log, start_new_session=True, close_fds=True)
        log.info("instance launched", workload=assignment.workload, node=self.node,
                 epoch=assignment.epoch, gpus=gpu_ids)

    def handover_refusal(self, parked: InstanceKey, submission: Submission,
                         gpu_ids: list[str]) -> str:
        """Why the parked warm member ``parked`` cannot become this node's next instance
        ("" if it can): it must have been launched warm, with the same command, working
        directory and GPUs, and the spec's ``env`` unchanged."""
        launch = read_launch(instance_dir(self.state_dir, parked)) or {}
        spec = submission.spec
        return relaunch_refusal(launch, spec, spec.workdir or os.getcwd(), gpu_ids)

    def hand_over(self, parked: InstanceKey, assignment: Assignment, submission: Submission,
                  gpu_ids: list[str], service: Submission | None = None) -> None:
        """Launch the next instance with the parked warm member's process (its guard becomes
        the new instance's: ``hafo.agent.guard``); ``handover_refusal`` said it may."""
        old = read_launch(instance_dir(self.state_dir, parked)) or {}
        epoch = old.get("env_epoch", parked.epoch)
        path = self._prepare(assignment, submission, gpu_ids, service,
                             warm=(str(old["warm_dir"]), int(epoch)))
        if path is None:
            return
        ask_handover(instance_dir(self.state_dir, parked), path)
        log.info("instance handed over", workload=assignment.workload, node=self.node,
                 epoch=assignment.epoch, parked=parked.epoch)

    def park(self, key: InstanceKey, state: GuardState) -> None:
        """Ask a warm member's guard to have its process park (once)."""
        if state.state != "running" or key in self.parking or key in self.stopping:
            return
        try:
            ask_park(instance_dir(self.state_dir, key))
        except OSError as exc:
            self._failed("park request", exc)
            return
        self.parking.add(key)
        log.info("instance parking", workload=key.workload, node=self.node, epoch=key.epoch)

    def _prepare(self, assignment: Assignment, submission: Submission, gpu_ids: list[str],
                 service: Submission | None, warm: tuple[str, int] | None = None
                 ) -> Path | None:
        """Write an instance's directory and launch file (None: it was recorded as not
        started). ``warm``: (warm directory, epoch of its process's environment) of the
        parked member it is handed to; a new warm member gets a warm directory of its
        own."""
        checkpoint_dir = workload_checkpoint_dir(self.checkpoint_root, assignment.workload)
        key = InstanceKey(assignment.workload, assignment.epoch)
        path = instance_dir(self.state_dir, key)
        spec = submission.spec
        taken = {port for other in list_instances(self.state_dir)
                 for port in self.ports_of(other).values()}
        try:
            ports = choose_ports(spec.ports, taken, self.port_range, assignment.epoch,
                                 assignment.workload)
        except NoFreePort as exc:  # reported as a failed start: restarted or moved
            path.mkdir(parents=True, exist_ok=False)
            self._mark_exited(key, None, str(exc), InstanceEnd.EXIT, exit_code=1)
            log.error("instance not started", workload=assignment.workload, node=self.node,
                      epoch=assignment.epoch, error=str(exc))
            return None
        path.mkdir(parents=True, exist_ok=False)
        progress_dir(path).mkdir()
        self._ports[key] = ports
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        gang = gang_env(assignment, self.node)
        inherited = {k: v for k, v in os.environ.items() if k not in SERVICE_MANAGER_ENV}
        tmpdir = make_tmpdir(key.workload, spec.env)
        private = {"TMPDIR": str(tmpdir), **kept_caches(inherited)} if tmpdir else {}
        env = {**inherited, **private, **(GANG_DEFAULTS if gang else {}), **spec.env,
               "HAFO_WORKLOAD": assignment.workload, "HAFO_EPOCH": str(assignment.epoch),
               "HAFO_NODE": self.node, "HAFO_CHECKPOINT_DIR": str(checkpoint_dir),
               PROGRESS_DIR_ENV: str(progress_dir(path)),
               MEMORY_DIR_ENV: str(self.memory_root / assignment.workload),
               **({ADDRESS_ENV: self.address} if self.address else {}),
               "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids), "PYTHONUNBUFFERED": "1", **gang,
               **port_env(ports)}
        warm_dir: str | None = None
        standby = assignment.is_gang and assignment.member_on(self.node) is None
        if standby:
            env[STANDBY_ENV] = "1"  # a warm gang's standby: no rank until handed one
        if warm is not None:
            warm_dir = warm[0]
        elif spec.warm and assignment.is_gang:
            made = self.state_dir / "warm" / key.dirname
            made.mkdir(parents=True, mode=0o700, exist_ok=True)
            warm_dir = str(made)
        if warm_dir is not None:
            env[WARM_DIR_ENV] = warm_dir
        cgroup = self.containment.of(self.node, key.dirname)
        write_json_atomic(path / SUBMISSION_FILE, {
            "workload": assignment.workload, "epoch": assignment.epoch,
            "submission": submission.to_dict(),
            "service": service.to_dict() if service is not None else None,
            "assignment": assignment.to_dict()})
        launched = self.boot_clock()
        self._launched[key] = launched
        write_json_atomic(path / "launch.json", {
            "workload": assignment.workload, "epoch": assignment.epoch, "node": self.node,
            "argv": list(spec.command), "env": env, "cwd": spec.workdir or os.getcwd(),
            "grace": spec.stop_grace, "fence_file": str(self.state_dir / FENCE_FILE),
            "checkpoint_mode": spec.checkpoint_mode, "ports": ports,
            "output_max_bytes": self.logs.max_mib * MIB, "launched_at": time.time(),
            "launched_boottime": launched, "boot": procid.boot_id(),
            "tmpdir": str(tmpdir) if tmpdir is not None else None,
            "cgroup": str(cgroup) if cgroup is not None else None,
            **({"warm_dir": warm_dir} if warm_dir is not None else {}),
            **({"standby": True} if standby else {}),
            **({"env_epoch": warm[1]} if warm is not None else {}),
            **({"preflight": preflight_options(spec.preflight, progress_dir(path))}
               if assignment.preflight and spec.preflight is not None and not standby
               and warm is None else {})})
        return path

    def stop(self, key: InstanceKey, state: GuardState, why: str, urgent: bool = False) -> None:
        """Ask the guard to stop its workload (once): checkpoint first (SIGTERM to the guard),
        or, ``urgent``, at once (SIGUSR2; also escalates a checkpoint-first stop)."""
        if state.state == "exited" or key in self.stopping_now or (
                key in self.stopping and not urgent):
            return
        guard = self._guard_identity(key, state)
        if not procid.send(guard, signal.SIGUSR2 if urgent else signal.SIGTERM):
            return  # its guard has not written its identity yet: asked again next cycle
        self.stopping.add(key)
        if urgent:
            self.stopping_now.add(key)
        log.info("instance stopping", workload=key.workload, node=self.node, epoch=key.epoch,
                 why=why, urgent=urgent)

    def kill_all(self, why: str) -> None:
        """Kill every instance at once (lease lost: someone else may run them now) and record
        each as fenced once its guard is gone (so the guard cannot overwrite the record)."""
        killed: list[tuple[InstanceKey, GuardState, ProcessId | None]] = []
        for key, state in self.states().items():
            if state.state == "exited":
                continue
            guard = self._guard_identity(key, state)
            procid.send(guard, signal.SIGSTOP)  # it must not start or record anything more
            self._kill_instance(key, state, guard)
            procid.send(guard, signal.SIGKILL)
            killed.append((key, state, guard))
            log.warning("instance killed", workload=key.workload, node=self.node,
                        epoch=key.epoch, why=why)
        deadline = time.monotonic() + 2.0
        for key, state, guard in killed:
            while procid.is_alive(guard) and time.monotonic() < deadline:
                reap_children()
                time.sleep(0.005)
            self._mark_exited(key, state, f"fenced: {why}", InstanceEnd.FENCED, exit_code=-9)

    def ports_of(self, key: InstanceKey) -> dict[str, int]:
        """The ports an instance was launched with (from its launch file, once)."""
        ports = self._ports.get(key)
        if ports is None:
            launch = read_launch(instance_dir(self.state_dir, key))
            if launch is None:
                return {}  # not launched yet: asked again later
            ports = self._ports[key] = read_ports(launch)
        return ports

    def memory_held(self) -> dict[str, int]:
        """Workload -> bytes of its RAM-tier snapshots on this node."""
        try:
            held = sorted(os.listdir(self.memory_root))
        except OSError:
            return {}
        return {workload: MemoryStore(self.memory_root / workload).bytes_held()
                for workload in held}

    def sweep_memory(self) -> list[str]:
        """Remove the RAM-tier snapshots (``<memory_root>/<workload>``) of each workload that
        has had no instance on this node for ``MEMORY_KEEP_IDLE`` seconds (on the boot
        clock): a gang's next epoch, on this node again within that time, restores from
        them. Returns the workloads whose snapshots were removed."""
        try:
            held = sorted(os.listdir(self.memory_root))
        except OSError:
            return []
        present = {key.workload for key in list_instances(self.state_dir)}
        now = self.boot_clock()
        removed = []
        for workload in held:
            if workload in present:
                self._memory_idle.pop(workload, None)
                continue
            since = self._memory_idle.setdefault(workload, now)
            if now - since >= MEMORY_KEEP_IDLE:
                shutil.rmtree(self.memory_root / workload, ignore_errors=True)
                self._memory_idle.pop(workload, None)
                removed.append(workload)
                log.info("RAM snapshots removed", workload=workload, node=self.node)
        for workload in [w for w in self._memory_idle if w not in held]:
            self._memory_idle.pop(workload, None)
        return removed

    def forget(self, key: InstanceKey) -> None:
        """Remove an exited, no longer desired instance (and the workload's private
        ``TMPDIR`` with its last instance on this node); its output moves to
        ``<state_dir>/logs/``, where the newest ``node.logs.keep_epochs`` ended instances of
        each workload are kept."""
        path = instance_dir(self.state_dir, key)
        ended = read_guard_state(path)
        launch = read_launch(path) or {}
        warm_dir = launch.get("warm_dir")
        if isinstance(warm_dir, str) and Path(warm_dir).parent == self.state_dir / "warm" \
                and (ended is None or ended.ended is not InstanceEnd.HANDED_OVER):
            # its process ended (its guard removes it; not a guard that was killed)
            shutil.rmtree(warm_dir, ignore_errors=True)
        if not any(other.workload == key.workload and other != key
                   for other in list_instances(self.state_dir)):  # its last one here
            with contextlib.suppress(OSError):
                remove_tmpdir(key.workload, launch.get("tmpdir"))
        with contextlib.suppress(OSError):
            keep_ended(self.state_dir, path, key.workload, key.epoch, self.logs.keep_epochs)
        self._unrecorded.pop(key, None)
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a state directory that refuses the removal: not seen again
            self._forgotten.add(key)
            self._failed("instance removal", exc)
        cgroup = self.containment.of(self.node, key.dirname)
        if cgroup is not None:
            cgroups.remove(cgroup)
        self._ports.pop(key, None)
        self._launches.pop(key, None)
        self._preflights.pop(key, None)
        self._launched.pop(key, None)
        self.stopping.discard(key)
        self.stopping_now.discard(key)
        self.parking.discard(key)

    # -- reporting ----------------------------------------------------------------------

    def checkpoint_info(self, workload: str, after: float | None = None) -> CheckpointInfo | None:
        """The workload's newest committed checkpoint (re-read at most every 2 s, and once
        more when the reading is older than ``after``, wall-clock: an instance's end, so that
        its exited report and its ``stopped`` event name the checkpoint the next instance
        restores, not one read up to 2 s before its last commit)."""
        now, wall = time.monotonic(), time.time()
        cached = self._checkpoint_cache.get(workload)
        if cached is not None and now - cached[0] < 2.0 and (after is None
                                                             or cached[1] >= after):
            return cached[2]
        refs = list_all_checkpoints(self.checkpoint_root / workload)
        info = CheckpointInfo(refs[0].step, refs[0].epoch, str(refs[0].path)) if refs else None
        self._checkpoint_cache[workload] = (now, wall, info)
        return info

    def status_of(self, key: InstanceKey, state: GuardState) -> InstanceStatus:
        """The report for one instance."""
        reported = "stopping" if (key in self.stopping and state.state != "exited") or (
            key in self.parking and state.state == "running") else state.state
        return InstanceStatus(workload=key.workload, node=self.node, epoch=key.epoch,
                              state=reported,  # type: ignore[arg-type]
                              pid=state.pid, exit_code=state.exit_code,
                              started_at=state.started_at, finished_at=state.finished_at,
                              checkpoint=self.checkpoint_info(
                                  key.workload, state.finished_at
                                  if state.state == "exited" else None),
                              ended=state.ended if state.state == "exited" else None,
                              ports=self.ports_of(key),
                              stderr_tail=bounded_tail(state.last_words)
                              if state.state == "exited" else "",
                              preflight=self.preflight_of(key))


def newest_per_workload(states: Mapping[InstanceKey, GuardState]) -> dict[str, InstanceKey]:
    """For each workload, its instance with the highest epoch."""
    out: dict[str, InstanceKey] = {}
    for key in states:
        if key.workload not in out or key.epoch > out[key.workload].epoch:
            out[key.workload] = key
    return out
