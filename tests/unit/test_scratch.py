"""The private TMPDIR of an instance (hafo/agent/scratch.py): made unless the spec sets one,
removed only where the agent made it."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

import pytest

from hafo.agent.instances import InstanceKey
from hafo.agent.scratch import make_tmpdir, remove_tmpdir


@pytest.fixture
def agent_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_made_under_the_agents_tmpdir_and_removed_with_its_contents(agent_tmp: Path) -> None:
    made = make_tmpdir(InstanceKey("job-0a1b2c", 4), {})
    assert made is not None and made.parent == agent_tmp
    (made / "torchelastic_x").mkdir()
    (made / "torchelastic_x" / "f").write_text("x")
    remove_tmpdir({"workload": "job-0a1b2c", "epoch": 4, "tmpdir": str(made)})
    assert not made.exists()


def test_two_instances_of_one_epoch_on_one_host_get_two_directories(agent_tmp: Path) -> None:
    key = InstanceKey("gang-0a1b2c", 2)  # gang members of one epoch, agents on one host
    assert make_tmpdir(key, {}) != make_tmpdir(key, {})


def test_none_when_the_spec_sets_tmpdir(agent_tmp: Path) -> None:
    assert make_tmpdir(InstanceKey("job-0a1b2c", 4), {"TMPDIR": "/scratch"}) is None
    assert list(agent_tmp.iterdir()) == []


@pytest.mark.parametrize("launch", [
    {},  # launched before this version: no tmpdir recorded
    {"workload": "job-0a1b2c", "epoch": 4, "tmpdir": None},
    {"workload": "job-0a1b2c", "epoch": 4, "tmpdir": ""},
    {"workload": "job-0a1b2c", "epoch": 4, "tmpdir": 7},
    {"workload": "job-0a1b2c", "epoch": 4, "tmpdir": "relative/hafo-job-0a1b2c.4-x"},
    {"workload": "job-0a1b2c", "epoch": 4, "tmpdir": "{victim}"},  # not one hafo made
    {"workload": "job-0a1b2c", "epoch": 5, "tmpdir": "{mine}"},  # another epoch's name
])
def test_a_launch_file_naming_anything_else_removes_nothing(
        agent_tmp: Path, launch: dict[str, object]) -> None:
    victim = agent_tmp / "data"
    victim.mkdir()
    mine = make_tmpdir(InstanceKey("job-0a1b2c", 4), {})
    if isinstance(launch.get("tmpdir"), str):
        launch = {**launch, "tmpdir": str(launch["tmpdir"]).format(victim=victim, mine=mine)}
    remove_tmpdir(launch)
    assert victim.exists() and mine is not None and mine.exists()


def test_a_symlink_in_its_place_is_not_followed(agent_tmp: Path) -> None:
    victim = agent_tmp / "data"
    victim.mkdir()
    (victim / "keep").write_text("x")
    link = agent_tmp / "hafo-job-0a1b2c.4-abc"
    link.symlink_to(victim)
    remove_tmpdir({"workload": "job-0a1b2c", "epoch": 4, "tmpdir": str(link)})
    assert (victim / "keep").exists()


def test_a_temporary_directory_that_cannot_be_made_leaves_the_agents(
        agent_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(**_kwargs: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", full_disk)
    assert make_tmpdir(InstanceKey("job-0a1b2c", 4), {}) is None  # started all the same
