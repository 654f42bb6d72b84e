"""The renewal brief and the config's state directory read without the config models."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from hafo.agent.renewal_brief import (
    BRIEF,
    read_brief,
    state_dir_of,
    write_brief,
)
from hafo.model.config import parse_config
from hafo.model.paths import DEFAULT_STATE_DIR

LAUGHS = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                   + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]"
                      for i in range(8)]
                   + ["node: {name: n1, state_dir: /srv/hafo}"]) + "\n"


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("node: {name: n1, state_dir: /srv/x}\n", "/srv/x", id="given"),
    pytest.param("node: {name: n1}\n", DEFAULT_STATE_DIR, id="default"),
    pytest.param("etcd: {endpoints: [a]}\n", None, id="no-node-section"),
    pytest.param("node: [1, 2]\n", None, id="node-not-a-mapping"),
    pytest.param("node: {state_dir: [1]}\n", None, id="state-dir-not-a-string"),
    pytest.param("node: {state_dir: ''}\n", None, id="state-dir-empty"),
    pytest.param("node: {state_dir: /x\n", None, id="not-yaml"),
    pytest.param("", None, id="empty"),
    pytest.param(LAUGHS, "/srv/hafo", id="billion-laughs-not-expanded"),
])
def test_state_dir_of(tmp_path: Path, text: str, expected: str | None) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    started = time.monotonic()
    found = state_dir_of(str(path))
    assert (str(found) if found is not None else None) == expected
    assert time.monotonic() - started < 1.0


def test_state_dir_of_a_missing_or_huge_file(tmp_path: Path) -> None:
    assert state_dir_of(str(tmp_path / "absent.yaml")) is None
    huge = tmp_path / "huge.yaml"
    huge.write_text("node: {name: n1}\n" + "#" * (2 << 20) + "\n")
    assert state_dir_of(str(huge)) is None


def _etcd(tmp_path: Path, **etcd: object) -> object:
    return parse_config({"node": {"name": "n1", "state_dir": str(tmp_path)},
                         "etcd": {"endpoints": ["http://127.0.0.1:2379"], **etcd}},
                        "agent").etcd


def test_a_brief_round_trips_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    etcd = _etcd(tmp_path, username="hafo", password_file="/etc/hafo/etcd.pw")
    assert write_brief(tmp_path, etcd, heartbeat=1.0, fence_margin=0.5)
    brief = read_brief(tmp_path)
    assert brief is not None and brief.endpoints == ("http://127.0.0.1:2379",)
    assert (brief.username, brief.password_file, brief.heartbeat, brief.fence_margin) == (
        "hafo", "/etc/hafo/etcd.pw", 1.0, 0.5)
    mode = next(tmp_path.rglob(BRIEF)).stat().st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_no_brief_with_an_inline_password(tmp_path: Path) -> None:
    assert write_brief(tmp_path, _etcd(tmp_path), 1.0, 0.5)
    assert not write_brief(tmp_path, _etcd(tmp_path, username="u", password="secret"), 1.0, 0.5)
    assert read_brief(tmp_path) is None
    assert "secret" not in "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())


@pytest.mark.parametrize("text", ['{"endpoints": []}', "[1]", "{", '{"endpoints": ["a"], '
                                  '"heartbeat": 1, "fence_margin": 0.5, "ca": 3}'])
def test_a_brief_of_the_wrong_shape_is_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / "instances").mkdir()
    (tmp_path / "instances" / BRIEF).write_text(text)
    assert read_brief(tmp_path) is None
