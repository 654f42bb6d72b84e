"""``hafo agent|controller --check --config FILE``: validate a daemon config and exit (the
Ansible roles validate every config they write with it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hafo.cli import main


@pytest.mark.parametrize(("role", "config", "code", "expected"), [
    ("agent", {"node": {"name": "n1"}}, 0, "a valid agent config"),
    ("controller", {"controller": {"name": "c1"}}, 0, "a valid controller config"),
    ("controller", {}, 2, "controller.name"),
    ("agent", {"node": {"name": "n1"}, "timing": {"lease_ttl": 3},
               "etcd": {"election_timeout": 1.0}}, 2, "etcd.election_timeout"),
    ("agent", {"node": {"name": "n1"}, "timing": {"lease_ttl": "x"}}, 2, "timing.lease_ttl"),
    ("controller", {"controller": {"name": "c1"}, "api": {"listen": "nowhere"}}, 2,
     "api.listen"),
])
def test_check_validates_and_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   role: str, config: dict[str, object], code: int,
                                   expected: str) -> None:
    path = tmp_path / f"{role}.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main([role, "--check", "--config", str(path)]) == code
    out = capsys.readouterr()
    lines = (out.out if code == 0 else out.err).strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out
