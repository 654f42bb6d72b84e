"""The overlap check on progress logs (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from hafo.local.progress import Overlap, history, overlaps


def line(workload: str, epoch: int, t: float) -> dict[str, Any]:
    return {"workload": workload, "epoch": epoch, "t": t}


@pytest.mark.parametrize(("lines", "expected"), [
    pytest.param([], [], id="empty"),
    pytest.param([line("a", 1, 0), line("a", 1, 1), line("a", 2, 2)], [], id="handover"),
    pytest.param([line("a", 1, 0), line("a", 2, 0.5), line("a", 1, 1)],
                 [Overlap("a", (1, 2), 0.5)], id="overlap"),
    pytest.param([line("a", 1, 0), line("b", 2, 0.5), line("a", 1, 1)], [],
                 id="other-workload-does-not-count"),
    pytest.param([line("a", 1, 0), line("a", 1, 10), line("a", 2, 1), line("a", 3, 5)],
                 [Overlap("a", (1, 2), 9), Overlap("a", (1, 3), 5)], id="long-zombie"),
])
def test_overlaps(lines: list[dict[str, Any]], expected: list[Overlap]) -> None:
    assert overlaps(lines) == expected



def logged(workload: str, epoch: int, t: float, pid: int) -> dict[str, Any]:
    return {"workload": workload, "epoch": epoch, "t": t, "node": "n1", "pid": pid,
            "boot": "b"}


@pytest.mark.parametrize(("lines", "restores", "expected"), [
    # a restored store's epochs may repeat the old ones: epoch 5 of the new history is not
    # epoch 5 of the old one, so the old 5 (0-1) and 7 (1-2) and the new 5 (3-4) are a
    # handover each; taken for one instance, 5 would span 0-4 and overlap 7
    pytest.param([logged("a", 5, 0, 10), logged("a", 5, 1, 10), logged("a", 7, 1, 11),
                  logged("a", 7, 2, 11), logged("a", 5, 3, 12), logged("a", 5, 4, 12)],
                 [2.5], [], id="repeated-epoch-of-a-new-history"),
    # the old instance logs on after the restore: still the old history's, and a new one of
    # the same number alive beside it is an overlap
    pytest.param([logged("a", 5, 0, 10), logged("a", 5, 4, 10), logged("a", 5, 3, 12),
                  logged("a", 5, 5, 12)],
                 [2.5], [Overlap("a", (5, 5), 1, (0, 1))], id="old-history-logging-on"),
    pytest.param([logged("a", 5, 0, 10), logged("a", 3, 2, 12), logged("a", 5, 3, 10)],
                 [1.0], [Overlap("a", (5, 3), 1, (0, 1))], id="across-histories"),
    # without restores, processes of one epoch (a gang's members) are one instance
    pytest.param([logged("a", 5, 0, 10), logged("a", 5, 1, 11), logged("a", 6, 2, 12)],
                 [], [], id="gang-members-share-an-epoch"),
])
def test_overlaps_across_restored_histories(lines: list[dict[str, Any]],
                                            restores: list[float],
                                            expected: list[Overlap]) -> None:
    assert overlaps(lines, restores) == expected
    assert history(2.0, [1.0, 3.0]) == 1 and history(1.0, [1.0]) == 1


@pytest.mark.parametrize("kinds", ["foo", "etcd-stall,nope", ","])
def test_chaos_kinds_must_be_fault_kinds(kinds: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hafo.chaos.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--kinds", kinds])
    assert exited.value.code == 2 and "--kinds" in capsys.readouterr().err
