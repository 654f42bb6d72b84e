"""The agent's RAM-tier snapshots of each workload (``node.memory_dir``): kept while the
workload has an instance on the node and for ``MEMORY_KEEP_IDLE`` seconds after its last one
(a gang's next epoch restores from them), then removed; their size is what the metrics
report."""

from __future__ import annotations

from pathlib import Path

from hafo.agent.instances import InstanceKey, instance_dir
from hafo.agent.supervisor import MEMORY_KEEP_IDLE, Supervisor


def supervisor(tmp_path: Path, clock: list[float]) -> Supervisor:
    return Supervisor("node-a", tmp_path / "state", tmp_path / "ck",
                      memory_root=tmp_path / "ram", boot_clock=lambda: clock[0])


def snapshot(root: Path, workload: str, size: int) -> None:
    path = root / workload / "own" / "rank-00000" / "ckpt-e000000000001-s000000000001"
    path.mkdir(parents=True)
    (path / "data.bin").write_bytes(b"x" * size)
    (path / "manifest.json").write_text("{}")


def test_kept_while_an_instance_is_here_and_for_a_while_after(tmp_path: Path) -> None:
    clock = [100.0]
    sup = supervisor(tmp_path, clock)
    snapshot(tmp_path / "ram", "busy", 1000)
    snapshot(tmp_path / "ram", "gone", 10)
    instance_dir(sup.state_dir, InstanceKey("busy", 3)).mkdir(parents=True)
    assert sup.memory_held() == {"busy": 1002, "gone": 12}
    assert sup.sweep_memory() == []  # "gone" idle from now on
    clock[0] += MEMORY_KEEP_IDLE - 1
    assert sup.sweep_memory() == []
    clock[0] += 1
    assert sup.sweep_memory() == ["gone"]
    assert sorted(p.name for p in (tmp_path / "ram").iterdir()) == ["busy"]
    clock[0] += 10 * MEMORY_KEEP_IDLE
    assert sup.sweep_memory() == []  # an instance is here: never removed


def test_an_instance_back_in_time_resets_the_wait(tmp_path: Path) -> None:
    clock = [0.0]
    sup = supervisor(tmp_path, clock)
    snapshot(tmp_path / "ram", "gang", 10)
    sup.sweep_memory()
    clock[0] = MEMORY_KEEP_IDLE - 5
    key = instance_dir(sup.state_dir, InstanceKey("gang", 4))
    key.mkdir(parents=True)
    assert sup.sweep_memory() == []
    key.rmdir()
    clock[0] = MEMORY_KEEP_IDLE + 5  # idle again, for 10 s only
    assert sup.sweep_memory() == []
    assert (tmp_path / "ram" / "gang").is_dir()


def test_no_memory_dir_is_nothing_held(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, [0.0])
    assert sup.memory_held() == {} and sup.sweep_memory() == []
