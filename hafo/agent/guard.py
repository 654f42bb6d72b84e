"""``hafo guard``: the parent of one workload process, and its executioner.

The guard starts the workload in its own session, then polls every 50 ms:
- the workload exited: record the exit code and leave;
- the node's fencing deadline passed without renewal (the agent is dead, frozen or cut off
  from etcd): SIGKILL the workload's process group at once, before the lease can expire and
  the workload be assigned elsewhere;
- SIGTERM (the agent stops the instance): SIGUSR1 to the workload, or to the processes of its
  session that listen for it (torchrun's workers; the checkpoint SDK turns it into
  ``should_checkpoint()``), wait up to the spec's ``stop_grace`` for a new checkpoint of
  this epoch, give it 2 s more to exit by itself (the SDK's usual way: save, then leave), then
  SIGTERM, and SIGKILL 10 s later: a planned move loses no work;
- SIGUSR2 (the agent stops the instance now: its application failed, or its GPU is lost):
  SIGTERM at once (also during a checkpoint wait), SIGKILL 5 s later;
- SIGUSR1: forwarded to the workload;
- a gang member whose launch asks for the pre-flight (``preflight``): the process starts as
  ``hafo.agent.preflight``, which execs the command once the gang passed it;
- a warm gang member (``warm_dir`` in its launch; ``hafo.agent.warm_member``): asked to park
  (the agent's ``park`` file), it asks the process to leave its epoch's process group and
  reports ``parked`` once the process confirmed it (or stops it at once if it did not within
  ``stop_grace``; a standby, asked at its start, within ``STANDBY_START_WAIT``); handed
  over (``handover.json``), it becomes the guard of the next epoch's instance with the same
  process: the process moves to that instance's cgroup, its
  output to that instance's directory, the old instance is recorded as ended
  (``handed-over``) after the new one is recorded as running, and the process is told its
  new epoch. A parked process that is stopped gets SIGTERM at once (it has no epoch to
  checkpoint).
The workload also gets PR_SET_PDEATHSIG=SIGKILL, so it dies with a killed guard. Its stdout
and stderr are pipes that a thread of the guard reads as fast as they fill
(``hafo.agent.outputlog``): into ``output.log``, capped and rotated at ``output_max_bytes``;
the last lines of stderr go into state.json as ``stderr_tail`` when it exits.
Imports are kept light: a guard starts in well under a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hafo.agent import cgroups, procid
from hafo.agent.fencefile import read_deadline
from hafo.agent.instances import read_launch, write_json_atomic
from hafo.agent.outputlog import DEFAULT_MAX_BYTES, OutputPump, OutputWriter
from hafo.agent.proctree import any_stopped, become_subreaper, descendants, kill_instance
from hafo.agent.warm_member import WarmLink
from hafo.decisions.fencing import must_kill
from hafo.decisions.handover import adoption_refusal
from hafo.model.ends import InstanceEnd

POLL = 0.05
TERM_GRACE = 10.0  # after SIGTERM, before SIGKILL
URGENT_TERM_GRACE = 5.0  # after an urgent SIGTERM, before SIGKILL
EXIT_AFTER_COMMIT = 2.0  # after the stop checkpoint commits, time to exit on its own
OUTPUT_DRAIN = 2.0  # after the workload exited, time for its pipes to close
PR_SET_PDEATHSIG = 1
PARK_MIN_WAIT = 5.0  # a warm member is given at least this long to confirm its park
#: A standby parks once its start-up is over (imports, the model built, a GPU context): that
#: may take minutes on a busy or big node, and no epoch waits on it (it is no member), so it
#: has this long, not ``stop_grace``, before it is stopped as one that will never park.
STANDBY_START_WAIT = 600.0


def catches(pid: int, sig: int) -> bool:
    """True if process ``pid`` has a handler installed for ``sig`` (from /proc's SigCgt)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def checkpoint_listeners(leader: int) -> list[procid.ProcessId]:
    """Who to ask for a checkpoint (SIGUSR1): the workload's process if it listens (the
    checkpoint SDK installs the handler), else every descendant of it that listens (the
    workers of a launcher such as torchrun, which would die of the signal itself); each with
    its identity, so that the signal goes to no process that took a number meanwhile."""
    pids = [leader] if catches(leader, signal.SIGUSR1) else [
        pid for pid in descendants(leader) if catches(pid, signal.SIGUSR1)]
    found = (procid.identify(pid) for pid in pids)
    return [identity for identity in found if identity is not None]


def preflight_argv(launch: dict[str, Any]) -> list[str]:
    """What runs before the command of a gang member whose launch asks for the pre-flight
    (``hafo.agent.preflight``: it execs the command, in the same process, once the gang
    passed it), or nothing."""
    options = launch.get("preflight")
    if not isinstance(options, dict):
        return []
    return [sys.executable, "-m", "hafo.agent.preflight", "--out", str(options["out"]),
            "--timeout", str(options["timeout"]), "--slowdown", str(options["slowdown"]),
            "--min-excess", str(options["min_excess"]), "--large-mib",
            str(options["large_mib"]), "--"]


def _child_setup(cgroup: Path | None) -> Any:
    """What the workload's process does between fork and exec: join the instance's cgroup
    (an error there stops the start: the instance would not be contained), die with the
    guard, drop the agent's OOM protection."""

    def setup() -> None:
        if cgroup is not None:
            cgroups.join(cgroup)
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _unprotect_from_oom()

    return setup


def _unprotect_from_oom(path: str = "/proc/self/oom_score_adj") -> None:
    """The agent's unit protects the agent (and so its guards) from the OOM killer
    (``OOMScoreAdjust=-500``); the workload must not inherit that, so a negative score is
    reset to 0 (raising it needs no privilege)."""
    with contextlib.suppress(OSError, ValueError), open(path, "r+b", buffering=0) as handle:
        if int(handle.read().strip() or b"0") < 0:
            handle.seek(0)
            handle.write(b"0")
            handle.truncate()  # a regular file (tests); /proc refuses, after the write


class Guard:
    """One guard process (one instance)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.launch: dict[str, Any] = json.loads((path / "launch.json").read_text())
        self.fence_file = Path(self.launch["fence_file"])
        self.grace = float(self.launch.get("grace", 30.0))
        cgroup = self.launch.get("cgroup")
        self.cgroup = Path(cgroup) if isinstance(cgroup, str) and cgroup else None
        self.state: dict[str, Any] = {"guard_pid": os.getpid(), "pid": None,
                                      "guard": procid.myself().to_dict(), "workload": None,
                                      "state": "starting", "exit_code": None,
                                      "started_at": None, "finished_at": None, "reason": ""}
        self.stop_requested = False
        self.urgent = False
        self.proc: subprocess.Popen[bytes] | None = None
        self.pump: OutputPump | None = None
        warm_dir = self.launch.get("warm_dir")
        self.warm = WarmLink(Path(warm_dir), path) if isinstance(warm_dir, str) and warm_dir \
            else None

    def write(self, **changes: Any) -> None:
        """Publish the guard's state (atomically)."""
        self.state.update(changes)
        write_json_atomic(self.path / "state.json", self.state)

    def _signal_group(self, sig: int) -> None:
        """Signal the workload's process group: only while the workload is our unreaped child
        (its number, and so its group's, cannot be anyone else's until we reap it)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def _kill_all(self) -> None:
        """SIGKILL every process of the instance, in any process group or session: its
        cgroup, until empty; without one, its process group, the guard's descendants and the
        processes its environment names (hafo.agent.proctree)."""
        if self.cgroup is not None:
            cgroups.kill(self.cgroup)
            return
        self._signal_group(signal.SIGKILL)
        kill_instance(str(self.launch["workload"]),
                      int(self.launch.get("env_epoch", self.launch["epoch"])),
                      str(self.launch["node"]), os.getpid())

    def _on_term(self, _sig: int, _frame: object) -> None:
        self.stop_requested = True

    def _on_usr2(self, _sig: int, _frame: object) -> None:
        self.stop_requested = self.urgent = True

    def _on_usr1(self, _sig: int, _frame: object) -> None:
        if self.proc is not None and self.proc.returncode is None:  # our unreaped child
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)

    def run(self) -> int:
        """Start the workload and watch it until it ends; returns the guard's exit status."""
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_usr1)
        signal.signal(signal.SIGUSR2, self._on_usr2)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        become_subreaper()  # workers whose launcher died stay ours to kill
        self.write()
        if must_kill(time.monotonic(), read_deadline(self.fence_file)):
            self.write(state="exited", exit_code=None, finished_at=time.time(),
                       ended=InstanceEnd.FENCED.value,
                       reason="fenced before start: lease deadline already passed")
            return 0
        if self.stop_requested:
            self.write(state="exited", finished_at=time.time(), ended=InstanceEnd.STOPPED.value,
                       reason="stopped before start")
            return 0
        writer = OutputWriter(self.path, int(self.launch.get("output_max_bytes",
                                                             DEFAULT_MAX_BYTES)))
        out_read, out_write = os.pipe()  # close-on-exec: only the child's 1 and 2 stay open
        err_read, err_write = os.pipe()
        try:
            if self.cgroup is not None:
                cgroups.make(self.cgroup)
            self.proc = subprocess.Popen(
                preflight_argv(self.launch) + list(self.launch["argv"]),
                env=self.launch["env"], cwd=self.launch.get("cwd"),
                stdin=subprocess.DEVNULL, stdout=out_write, stderr=err_write,
                start_new_session=True, preexec_fn=_child_setup(self.cgroup))
        except (OSError, subprocess.SubprocessError) as exc:
            for fd in (out_read, err_read):
                os.close(fd)
            writer.close()
            self.write(state="exited", exit_code=127, finished_at=time.time(),
                       ended=InstanceEnd.EXIT.value, reason=f"could not start: {exc}")
            return 0
        finally:
            os.close(out_write)
            os.close(err_write)
        self.pump = OutputPump(writer, out_read, err_read)
        self.pump.start()
        workload = procid.identify(self.proc.pid)  # our unreaped child: its number is its own
        self.write(state="running", pid=self.proc.pid, started_at=time.time(),
                   workload=workload.to_dict() if workload is not None else None)
        return self._supervise()

    def _drain_output(self) -> str:
        """Wait (briefly) until the workload's output is written; its stderr's last lines."""
        if self.pump is None:
            return ""
        self.pump.join(OUTPUT_DRAIN)
        return self.pump.stderr_tail()

    def _newest_checkpoint(self) -> tuple[int, int]:
        # imported here: the checkpoint format (its CRC library) costs 70 ms at every start
        from hafo.checkpoint.sharded import list_all_checkpoints

        root = self.launch["env"].get("HAFO_CHECKPOINT_DIR")
        refs = list_all_checkpoints(Path(root)) if root else []
        return (refs[0].epoch, refs[0].step) if refs else (0, -1)

    def _supervise(self) -> int:
        """Watch the workload. A stop asks for a checkpoint first (SIGUSR1), waits up to the
        grace period for a new commit of this epoch, then SIGTERM, then SIGKILL."""
        assert self.proc is not None
        checkpoint_by: float | None = None  # waiting for the stop checkpoint until then
        baseline = (0, -1)
        exit_by: float | None = None  # checkpoint committed; SIGTERM if still running then
        term_by: float | None = None  # SIGTERM sent; SIGKILL at this time
        killed = stopping = fenced = parked = False
        park_by: float | None = None  # a warm member asked to park: stopped if not by then
        while True:
            code = self.proc.poll()
            if code is not None:
                if checkpoint_by is not None:  # it exited while we waited for its checkpoint
                    newest = self._newest_checkpoint()
                    if newest > baseline and newest[0] == int(self.launch["epoch"]):
                        self.state.update(stop_checkpoint=newest[1],
                                          reason=f"stopped after checkpoint step {newest[1]}")
                reason = self.state["reason"] or f"exited with code {code}"
                ended = (InstanceEnd.FENCED if fenced else
                         InstanceEnd.STOPPED if stopping or self.stop_requested else
                         InstanceEnd.EXIT)
                self._kill_all()  # leftovers, in its session or not
                self.write(state="exited", exit_code=code, finished_at=time.time(),
                           ended=ended.value, reason=reason, stderr_tail=self._drain_output())
                if self.warm is not None:
                    shutil.rmtree(self.warm.warm_dir, ignore_errors=True)
                return 0
            now = time.monotonic()
            if not killed and must_kill(now, read_deadline(self.fence_file)):
                self._kill_all()
                killed = fenced = True
                self.state["reason"] = "fenced: lease deadline passed without renewal"
            elif self.urgent and not killed and (not stopping or checkpoint_by is not None
                                                  or exit_by is not None):
                stopping, checkpoint_by, exit_by = True, None, None
                self._signal_group(signal.SIGTERM)
                if term_by is None or term_by > now + URGENT_TERM_GRACE:
                    term_by = now + URGENT_TERM_GRACE
                if any_stopped(descendants(os.getpid())):
                    # a stopped process (SIGSTOP: a hung rank) cannot act on SIGTERM: waiting
                    # URGENT_TERM_GRACE for it would only delay the next epoch
                    self._kill_all()
                    killed = True
                    self.write(state="stopping", reason="killed at once by the agent: a "
                                                        "process of it was stopped")
                else:
                    self.write(state="stopping", reason="stopped at once by the agent")
            elif self.warm is not None and not (parked or stopping or self.stop_requested) \
                    and park_by is None and (self.launch.get("standby") is True
                                             or self.warm.park_asked()):
                self.warm.request_park(int(self.launch["epoch"]))
                park_by = now + (STANDBY_START_WAIT if self.launch.get("standby") is True
                                 else max(self.grace, PARK_MIN_WAIT))
                self.write(reason=f"parking: asked to leave epoch {self.launch['epoch']}'s "
                                  "process group")
            elif self.warm is not None and park_by is not None and not parked \
                    and not self.stop_requested:
                if self.warm.parked(int(self.launch["epoch"]), self.proc.pid):
                    parked, park_by = True, None
                    self.write(state="parked", reason=f"parked: left epoch "
                                                      f"{self.launch['epoch']}'s process group")
                elif now >= park_by:
                    park_by = None
                    self.stop_requested = self.urgent = True
                    self.write(reason="did not park within stop_grace: stopped at once")
            elif parked and not self.stop_requested and self.warm is not None:
                target = self.warm.handover_target()
                if target is not None and self._hand_over(target):
                    parked = False
            elif parked and self.stop_requested and not stopping:
                stopping = True  # a parked process has no epoch to checkpoint
                self._signal_group(signal.SIGTERM)
                term_by = now + TERM_GRACE
                self.write(state="stopping", reason="parked member stopped by the agent")
            elif self.stop_requested and not stopping:
                if self.launch.get("checkpoint_mode") == "transparent":
                    # imported here: the checkpoint package costs 0.1 s at every start
                    from hafo.checkpoint.transparent import unavailable_reason

                    self.state["transparent"] = unavailable_reason()
                stopping = True
                listeners = checkpoint_listeners(self.proc.pid)
                if listeners:  # the checkpoint SDK listens
                    baseline = self._newest_checkpoint()
                    for listener in listeners:
                        procid.send(listener, signal.SIGUSR1)
                    checkpoint_by = now + self.grace
                    self.write(state="stopping", reason="stopping: checkpoint requested")
                else:  # SIGUSR1 would kill it: a plain SIGTERM
                    self._signal_group(signal.SIGTERM)
                    term_by = now + max(self.grace, 1.0)
                    self.write(state="stopping", reason="stopped by the agent")
            elif checkpoint_by is not None:
                newest = self._newest_checkpoint()
                committed = newest > baseline and newest[0] == int(self.launch["epoch"])
                if committed:  # it may be about to exit by itself: let it, for a moment
                    exit_by, checkpoint_by = now + EXIT_AFTER_COMMIT, None
                    self.write(stop_checkpoint=newest[1],
                               reason=f"stopped after checkpoint step {newest[1]}")
                elif now >= checkpoint_by:
                    self._signal_group(signal.SIGTERM)
                    term_by, checkpoint_by = now + TERM_GRACE, None
                    self.write(stop_checkpoint=None,
                               reason="stopped: no checkpoint within stop_grace")
            elif exit_by is not None and now >= exit_by:
                self._signal_group(signal.SIGTERM)
                term_by, exit_by = now + TERM_GRACE, None
            elif term_by is not None and now >= term_by and not killed:
                self._kill_all()
                killed = True
            time.sleep(POLL)


    def _hand_over(self, target: Path) -> bool:
        """Become the guard of the instance launched in ``target`` with the parked process
        (``hafo.agent.warm_member``); False (and nothing changed) if that launch is not this
        lineage's next instance or the process could not be moved into its cgroup."""
        assert self.proc is not None and self.pump is not None and self.warm is not None
        launch = read_launch(target)
        refusal = adoption_refusal(self.launch, launch)
        if refusal == "" and launch is not None:
            cgroup = launch.get("cgroup")
            new_cgroup = Path(cgroup) if isinstance(cgroup, str) and cgroup else None
            if (self.cgroup is None) != (new_cgroup is None) or (
                    self.cgroup is not None and new_cgroup is not None
                    and not cgroups.move(self.cgroup, new_cgroup)):
                refusal = "the process could not move into the new instance's cgroup"
        if refusal or launch is None:
            print(f"hafo guard: hand-over to {target} refused: {refusal}", file=sys.stderr,
                  flush=True)
            (self.path / "handover.json").unlink(missing_ok=True)
            return False
        old_path, old_launch, now = self.path, self.launch, time.time()
        old_started = self.state.get("started_at")
        writer = OutputWriter(target, int(launch.get("output_max_bytes", DEFAULT_MAX_BYTES)))
        self.pump.retarget(writer)
        self.path, self.launch = target, launch
        self.fence_file = Path(launch["fence_file"])
        self.grace = float(launch.get("grace", 30.0))
        cgroup = launch.get("cgroup")
        self.cgroup = Path(cgroup) if isinstance(cgroup, str) and cgroup else None
        self.warm = WarmLink(self.warm.warm_dir, target)
        # the new instance first: the agent never sees the process in neither
        self.write(state="running", started_at=now, finished_at=None, exit_code=None,
                   handed_from=int(old_launch["epoch"]), reason="")
        write_json_atomic(old_path / "state.json", {
            **self.state, "state": "exited", "exit_code": None, "finished_at": now,
            "ended": InstanceEnd.HANDED_OVER.value, "handed_from": None,
            "started_at": old_started,
            "reason": f"handed over to instance {launch['epoch']}"})
        self.warm.hand_over(int(launch["epoch"]), old_launch.get("env", {}),
                            launch.get("env", {}))
        return True


def main(argv: list[str]) -> int:
    """Entry point: ``hafo guard INSTANCE_DIR``."""
    if len(argv) != 1:
        print("usage: hafo guard INSTANCE_DIR", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not (path / "launch.json").exists():
        print(f"hafo guard: {path}/launch.json not found", file=sys.stderr)
        return 2
    return Guard(path).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
