"""``hafo submit`` validates each check's options with its check type before writing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def test_a_check_type_not_installed_here_only_warns_when_allowed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: x\ncommand: ["true"]\nchecks: [{type: elsewhere}]\n')
    assert main(["submit", str(spec), "--allow-unknown-checks", *UNREACHABLE]) == 3
    err = capsys.readouterr().err  # valid; then etcd is unreachable
    assert "'elsewhere' is not installed here" in err and "cannot reach etcd" in err


def test_a_misspelled_check_type_is_refused_with_the_known_types(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text('name: x\ncommand: ["true"]\nchecks: [{type: exec, command: ["true"]}, '
                    '{type: htpp, url: "http://127.0.0.1:1/"}]\n')
    assert main(["submit", str(spec), *UNREACHABLE]) == 2  # before etcd is asked
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"hafo: {spec}: spec.checks[1].type: unknown check type 'htpp', "
                             "did you mean 'http'? (known: "), err
    assert "exec, http" in err[0] and "--allow-unknown-checks" in err[0]


@pytest.mark.parametrize(("argv", "env", "config", "expected"), [
    ([], {}, None, (("http://127.0.0.1:2379",), "default")),
    ([], {"HAFO_ETCD": "http://a:1,http://b:2", "HAFO_CLUSTER": "c1"}, None,
     (("http://a:1", "http://b:2"), "c1")),
    ([], {"HAFO_ETCD": "http://a:1"}, {"cluster": "f", "etcd": {"endpoints": ["http://f:3"]}},
     (("http://f:3",), "f")),
    (["--etcd", "http://x:9", "--cluster", "x"], {"HAFO_ETCD": "http://a:1"},
     {"cluster": "f", "etcd": {"endpoints": ["http://f:3"]}}, (("http://x:9",), "x")),
])
def test_where_the_cli_takes_its_etcd_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               argv: list[str], env: dict[str, str],
                                               config: dict[str, Any] | None,
                                               expected: tuple[tuple[str, ...], str]) -> None:
    import yaml

    from hafo.cli import build_parser, etcd_settings

    for name in ("HAFO_ETCD", "HAFO_CLUSTER", "HAFO_CONFIG", "HAFO_ETCD_CA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if config is not None:
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = [*argv, "--config", str(path)]
    settings, cluster = etcd_settings(build_parser().parse_args(["status", *argv]))
    assert (settings.endpoints, cluster) == expected
