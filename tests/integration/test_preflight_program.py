"""The pre-flight program (``python -m hafo.agent.preflight``; docs/reference/gangs.md,
"Pre-flight") with real processes: three members on 127.0.0.1 meet on a free port, time the
probe and the all-reduces (gloo), judge, and exec the command in the same process, or fail
with ``EXIT_PREFLIGHT_FAILED`` naming the same ranks in every report.

Every wait is bounded; every process started here is killed by its pid in a ``finally``;
the cgroup made for the slow member is removed once its process is gone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hafo.model.preflight import EXIT_PREFLIGHT_FAILED, Preflight, parse_preflight

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(150)

#: What runs once the gang passed: it records its pid, its rank, its descriptors and an
#: environment variable the pre-flight sets for itself; rank 0 also opens a TCPStore server on
#: MASTER_PORT, which the pre-flight's own store held a moment before.
COMMAND = r"""
import json, os, sys
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
info = {"pid": os.getpid(), "rank": os.environ["HAFO_GANG_RANK"], "fds": fds,
        "cpp_log_level": os.environ.get("TORCH_CPP_LOG_LEVEL")}
if info["rank"] == "0":
    from datetime import timedelta
    import torch.distributed as dist
    try:
        store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 1, True,
                              timedelta(seconds=10), wait_for_workers=False)
        store.set("again", "yes")
        info["store"] = store.get("again").decode()
    except Exception as error:
        info["store"] = f"failed: {error}"
with open(sys.argv[1] + ".tmp", "w") as out:
    json.dump(info, out)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


#: Runs the pre-flight (the arguments after the first) in a process that imported torch and
#: hafo and built the report's schema at full speed, and then moved itself into the cgroup
#: whose ``cgroup.procs`` is the first argument: torch's import at 3% of a core would take
#: more than a minute, hafo's imports and schemas more than ten seconds.
SLOWED = r"""
import json, os, sys
import torch.distributed
from hafo.agent import preflight
from hafo.model.preflight import Preflight, RankFigures, parse_preflight
figures = RankFigures(rank=0, node="n", compute=0.1, joined=0.1)
assert parse_preflight(json.dumps(Preflight(passed=True, ranks=(figures,)).to_dict()))
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
preflight.run(sys.argv[2:])
"""


def free_port() -> int:
    """A port nobody listens on now (bound to port 0, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Gang:
    """The members of one test gang: started, waited for and killed by pid."""

    base: Path
    size: int = 3
    port: int = field(default_factory=free_port)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def report_path(self, rank: int) -> Path:
        return self.base / f"member-{rank}" / "progress" / "preflight.json"

    def ran_path(self, rank: int) -> Path:
        return self.base / f"ran-{rank}.json"

    def start(self, rank: int, timeout: float = 20, slowdown: float = 3,
              min_excess: float = 0.05, large_mib: int = 4,
              cgroup_procs: Path | None = None) -> subprocess.Popen[bytes]:
        """Start member ``rank`` (in the cgroup of ``cgroup_procs`` once torch is
        imported)."""
        env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
        env.update(HAFO_GANG_RANK=str(rank), HAFO_GANG_SIZE=str(self.size),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port),
                   HAFO_NODE=f"node-{rank}", PYTHONUNBUFFERED="1")
        program = ["-m", "hafo.agent.preflight"] if cgroup_procs is None else [
            "-c", SLOWED, str(cgroup_procs)]
        argv = [sys.executable, *program,
                "--out", str(self.report_path(rank)), "--timeout", f"{timeout:g}",
                "--slowdown", f"{slowdown:g}", "--min-excess", f"{min_excess:g}",
                "--large-mib", str(large_mib), "--",
                sys.executable, "-c", COMMAND, str(self.ran_path(rank))]
        with open(self.base / f"stderr-{rank}.log", "wb") as log:
            proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
        self.procs[rank] = proc
        return proc

    def wait(self, rank: int, timeout: float) -> int:
        """The member's exit status (its command's, once the pre-flight exec'd it)."""
        try:
            return self.procs[rank].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"member {rank} still running after {timeout:g}s:\n{self.log(rank)}")

    def log(self, rank: int) -> str:
        path = self.base / f"stderr-{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def report(self, rank: int) -> Preflight:
        path = self.report_path(rank)
        assert path.exists(), f"member {rank} wrote no report:\n{self.log(rank)}"
        report = parse_preflight(path.read_text())
        assert report is not None, path.read_text()
        return report

    def ran(self, rank: int) -> dict[str, Any] | None:
        path = self.ran_path(rank)
        return json.loads(path.read_text()) if path.exists() else None

    def kill(self) -> None:
        """Kill every member still running, by its pid, and reap it."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def gang(tmp_path: Path) -> Iterator[Gang]:
    members = Gang(tmp_path)
    try:
        yield members
    finally:
        members.kill()


def test_the_gang_passes_and_each_member_execs_its_command_in_the_same_process(
        gang: Gang) -> None:
    began = time.monotonic()
    for rank in range(gang.size):
        gang.start(rank)
    for rank in range(gang.size):
        assert gang.wait(rank, 60) == 0, gang.log(rank)
    elapsed = time.monotonic() - began

    reports = [gang.report(rank) for rank in range(gang.size)]
    for rank, report in enumerate(reports):
        assert report.passed, (report, gang.log(rank))
        assert (report.blamed, report.why, report.backend) == ((), "", "gloo")
        assert [f.rank for f in report.ranks] == [0, 1, 2]
        assert [f.node for f in report.ranks] == ["node-0", "node-1", "node-2"]
        assert all(f.compute > 0 and f.joined > 0 for f in report.ranks)
        assert report.small_latency is not None and report.small_latency > 0
        assert report.large_bandwidth is not None and report.large_bandwidth > 0
        assert report.large_bytes == 4 * 2**20
        assert 0 < report.seconds < elapsed
        assert report.ranks == reports[0].ranks  # the same figures everywhere
        assert f"rank {rank} of 3: passed in" in gang.log(rank)
        ran = gang.ran(rank)
        assert ran is not None, gang.log(rank)
        # exec'd: the same process, its descriptors closed, the environment unchanged
        assert ran["pid"] == gang.procs[rank].pid
        assert ran["rank"] == str(rank)
        assert set(ran["fds"]) <= {0, 1, 2, 3}  # 3: os.listdir's own
        assert ran["cpp_log_level"] is None
    # the pre-flight's store closed its listening socket: rank 0's command listens there
    assert gang.ran(0)["store"] == "yes"  # type: ignore[index]
    print(f"\npre-flight of 3 members: {[r.seconds for r in reports]}s; compute "
          f"{[f.compute for f in reports[0].ranks]}s; joined "
          f"{[f.joined for f in reports[0].ranks]}s; all-reduce "
          f"{reports[0].small_latency:.6f}s, {reports[0].large_bandwidth:.3g} B/s; "
          f"whole test {elapsed:.1f}s")


def test_a_member_that_never_starts_is_blamed_and_no_command_runs(gang: Gang) -> None:
    began = time.monotonic()
    for rank in (0, 1):
        gang.start(rank, timeout=3)
    for rank in (0, 1):
        assert gang.wait(rank, 30) == EXIT_PREFLIGHT_FAILED, gang.log(rank)
    elapsed = time.monotonic() - began
    # 3 s after torch's import (seconds on a busy machine) and rank 0's short linger
    assert elapsed < 30, elapsed
    for rank in (0, 1):
        report = gang.report(rank)
        assert not report.passed
        assert report.blamed == (2,)
        assert report.why == "rank 2 did not join within 3s"
        assert report.ranks == ()
        assert gang.ran(rank) is None
        assert "failed in" in gang.log(rank) and "Traceback" not in gang.log(rank)
    print(f"\nrank 2 missing: ranks 0 and 1 failed within {elapsed:.1f}s")


def _cgroup_v2_root() -> Path | None:
    """A cgroup v2 hierarchy whose root hands the cpu controller to its children."""
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = root / "cgroup.controllers"
        if not controllers.exists() or "cpu" not in controllers.read_text().split():
            continue
        subtree = root / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            try:
                subtree.write_text("+cpu")
            except OSError:
                continue
        return root
    return None


@dataclass
class CpuLimit:
    """A cgroup of this test whose processes get at most ``quota`` of each ``period``
    microseconds of CPU (none until ``limit``)."""

    path: Path
    version: int

    def limit(self, quota_us: int, period_us: int = 100_000) -> None:
        if self.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            (self.path / "cpu.max").write_text(f"{quota_us} {period_us}")

    @property
    def procs(self) -> Path:
        """Where a process writes its pid to join the group."""
        return self.path / "cgroup.procs"


@contextmanager
def cpu_limited_group() -> Iterator[CpuLimit]:
    """A cgroup of this test (cgroup v1's cpu controller, else v2's), removed afterwards
    (its processes must be gone by then); skips the test where neither can be made."""
    name = f"hafo-test-{os.getpid()}"
    v1 = Path("/sys/fs/cgroup/cpu")
    group: CpuLimit | None = None
    why = "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with cpu)"
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            group = CpuLimit(v1 / name, 1)
        elif (root := _cgroup_v2_root()) is not None:
            group = CpuLimit(root / name, 2)
        if group is not None:
            group.path.mkdir()
    except OSError as error:
        why, group = f"cannot make a cgroup: {error}", None
    if group is None:
        pytest.skip(why)
    try:
        yield group
    finally:
        until = time.monotonic() + 10
        while group.path.exists():
            try:
                group.path.rmdir()
            except OSError:
                if time.monotonic() > until:
                    raise
                time.sleep(0.1)


def test_a_much_slower_member_is_blamed_by_every_member(gang: Gang) -> None:
    with cpu_limited_group() as group:
        try:
            began = time.monotonic()
            # 3 ms of every 100 ms: rank 1's probe is ~30 times slower on an idle machine,
            # still ~7 times on one whose other members get a fifth of a core each (measured
            # with another test run beside it; 5% gave 3.8x there, too close to 3). The
            # collectives' timeout leaves room for its probe (6 runs of ~70 ms of CPU at 3%:
            # about 14 s), which the others wait for in the next all-reduce.
            group.limit(3_000)
            for rank in range(gang.size):
                gang.start(rank, timeout=30, cgroup_procs=group.procs if rank == 1 else None)
            codes = [gang.wait(rank, 90) for rank in range(gang.size)]
            elapsed = time.monotonic() - began
        finally:
            gang.kill()
        assert codes == [EXIT_PREFLIGHT_FAILED] * 3, [gang.log(r) for r in range(3)]
        reports = [gang.report(rank) for rank in range(gang.size)]
        for rank, report in enumerate(reports):
            assert not report.passed
            assert report.blamed == (1,), (report, gang.log(rank))
            assert report.why.startswith("rank 1's probe took "), report.why
            assert report.why.endswith("(slowdown 3)")
            assert gang.ran(rank) is None
        computes = [f.compute for f in reports[0].ranks]
        assert computes[1] > 3 * max(computes[0], computes[2])
        print(f"\nthrottled: compute {computes}s; {reports[0].why}; "
              f"pre-flight {[r.seconds for r in reports]}s; whole test {elapsed:.1f}s")


def _args(*extra: str) -> Sequence[str]:
    return [sys.executable, "-m", "hafo.agent.preflight", *extra]


@pytest.mark.parametrize(("env", "args", "said", "blamed"), [
    ({"HAFO_GANG_SIZE": "3"}, (), "HAFO_GANG_RANK is not set", ()),
    ({"HAFO_GANG_RANK": "1", "HAFO_GANG_SIZE": "x"}, (),
     "HAFO_GANG_SIZE='x' is not a gang's size (an integer from 1)", (1,)),
    ({"HAFO_GANG_RANK": "1", "HAFO_GANG_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
      "MASTER_PORT": "70000"}, (), "MASTER_PORT='70000' is not a port (an integer 1 to 65535)",
     (1,)),
    ({"HAFO_GANG_RANK": "1", "HAFO_GANG_SIZE": "3", "MASTER_PORT": "1234"}, (),
     "MASTER_ADDR is not set", (1,)),
    ({}, ("--timeout", "soon"), "--timeout 'soon' is not a number above 0", ()),
])
def test_a_bad_variable_or_argument_is_named_in_one_line(
        tmp_path: Path, env: dict[str, str], args: tuple[str, ...], said: str,
        blamed: tuple[int, ...]) -> None:
    out = tmp_path / "progress" / "preflight.json"
    clean = {k: v for k, v in os.environ.items()
             if k not in ("HAFO_GANG_RANK", "HAFO_GANG_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(
        _args("--out", str(out), *args, "--", sys.executable, "-c", "print('ran')"),
        env={**clean, **env}, cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False)
    assert done.returncode == EXIT_PREFLIGHT_FAILED
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"hafo preflight: failed: {said}"]
    report = parse_preflight(out.read_text())
    assert report is not None
    assert (report.passed, report.blamed, report.why) == (False, blamed, said)
