"""A workload's private TMPDIR on a node (hafo/agent/scratch.py): made unless the spec sets
one, kept across the workload's instances, removed only where the agent made it."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

import pytest

from hafo.agent.scratch import kept_caches, make_tmpdir, remove_tmpdir, tmpdir_name


@pytest.fixture
def agent_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_made_under_the_agents_tmpdir_and_removed_with_its_contents(agent_tmp: Path) -> None:
    made = make_tmpdir("job-0a1b2c", {})
    assert made == agent_tmp / "hafo-tmp.job-0a1b2c"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    (made / "torchelastic_x").mkdir()
    (made / "torchelastic_x" / "f").write_text("x")
    remove_tmpdir("job-0a1b2c", str(made))
    assert not made.exists()


def test_the_next_instance_of_the_workload_finds_what_the_last_one_left(
        agent_tmp: Path) -> None:
    first = make_tmpdir("job-0a1b2c", {})
    assert first is not None
    (first / "torchinductor_root").mkdir()  # torch.compile's cache
    assert make_tmpdir("job-0a1b2c", {}) == first
    assert (first / "torchinductor_root").is_dir()
    assert make_tmpdir("other-0a1b2c", {}) != first


def test_a_loose_mode_is_tightened(agent_tmp: Path) -> None:
    path = agent_tmp / tmpdir_name("job-0a1b2c")
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    assert make_tmpdir("job-0a1b2c", {}) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_none_when_the_spec_sets_tmpdir(agent_tmp: Path) -> None:
    assert make_tmpdir("job-0a1b2c", {"TMPDIR": "/scratch"}) is None
    assert list(agent_tmp.iterdir()) == []


def test_a_name_taken_by_a_file_or_symlink_is_not_used(agent_tmp: Path) -> None:
    victim = agent_tmp / "data"
    victim.mkdir()
    (agent_tmp / tmpdir_name("job-0a1b2c")).symlink_to(victim)
    (agent_tmp / tmpdir_name("other-0a1b2c")).write_text("x")
    assert make_tmpdir("job-0a1b2c", {}) is None
    assert make_tmpdir("other-0a1b2c", {}) is None


def test_a_directory_that_cannot_be_made_leaves_the_agents(
        agent_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "mkdir", full_disk)
    assert make_tmpdir("job-0a1b2c", {}) is None  # started all the same


def test_removed_at_its_default_place_when_none_was_recorded(agent_tmp: Path) -> None:
    made = make_tmpdir("job-0a1b2c", {})
    assert made is not None
    remove_tmpdir("job-0a1b2c", None)  # e.g. its last instance never started
    assert not made.exists()


@pytest.mark.parametrize("recorded", [
    7, "", "relative/hafo-tmp.job-0a1b2c", "{victim}", "{other}",
])
def test_a_launch_file_naming_anything_else_removes_nothing_else(
        agent_tmp: Path, recorded: object) -> None:
    victim = agent_tmp / "data"
    victim.mkdir()
    other = make_tmpdir("other-0a1b2c", {})
    if isinstance(recorded, str):
        recorded = recorded.format(victim=victim, other=other)
    remove_tmpdir("job-0a1b2c", recorded)
    assert victim.exists() and other is not None and other.exists()


def test_a_symlink_in_its_place_is_not_followed(agent_tmp: Path) -> None:
    victim = agent_tmp / "data"
    victim.mkdir()
    (victim / "keep").write_text("x")
    link = agent_tmp / tmpdir_name("job-0a1b2c")
    link.symlink_to(victim)
    remove_tmpdir("job-0a1b2c", str(link))
    assert (victim / "keep").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_directory_by_that_name_is_neither_used_nor_removed(
        agent_tmp: Path) -> None:
    theirs = agent_tmp / tmpdir_name("job-0a1b2c")
    theirs.mkdir(mode=0o700)
    (theirs / "keep").write_text("x")
    os.chown(theirs, 65534, 65534)  # made first by someone else on a shared /tmp
    assert make_tmpdir("job-0a1b2c", {}) is None
    remove_tmpdir("job-0a1b2c", str(theirs))
    assert (theirs / "keep").exists()


def test_torch_compiles_cache_stays_where_pytorch_would_have_kept_it(agent_tmp: Path) -> None:
    """A private TMPDIR would move torch.compile's cache into it (and so away with the
    workload): it is pointed back at the path PyTorch uses under the agent's TMPDIR."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert kept_caches({}) == {"TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    assert default_cache_dir().startswith(str(agent_tmp))
    assert kept_caches({"TORCHINDUCTOR_CACHE_DIR": "/cache"}) == {}  # the agent's own setting
