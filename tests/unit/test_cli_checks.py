"""``hafo submit`` validates each check's options with its check type before writing."""

from __future__ import annotations

from pathlib import Path

import pytest

from hafo.cli import main

UNREACHABLE = ["--etcd", "http://127.0.0.1:1"]


@pytest.mark.parametrize(("check", "field"), [
    ({"type": "http", "url": "ftp://x"}, "spec.checks[0].url"),
    ({"type": "tcp"}, "spec.checks[0].port"),
    ({"type": "progress"}, "spec.checks[0].stall_after"),
    ({"type": "training"}, "spec.checks[0].stall_after"),  # from the installed plugin
])
def test_bad_check_options_are_refused_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], check: dict[str, object],
        field: str) -> None:
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "x", "command": ["true"], "checks": [check]}))
    assert main(["submit", str(spec), *UNREACHABLE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0], err


def test_a_check_type_not_installed_here_only_warns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: x\ncommand: ["true"]\nchecks: [{type: elsewhere}]\n')
    assert main(["submit", str(spec), *UNREACHABLE]) == 3  # valid; then etcd is unreachable
    err = capsys.readouterr().err
    assert "'elsewhere' is not installed here" in err and "cannot reach etcd" in err
