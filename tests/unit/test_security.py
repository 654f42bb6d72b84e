"""Input that tries to escape: workload names and ids never leave the checkpoint root or reach
a shell; no code runs a shell; malformed config and specs get one error naming the field."""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from hafo.model.config import parse_config
from hafo.model.errors import ValidationError
from hafo.model.names import checkpoint_dir, is_node_name, is_workload_id
from hafo.model.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
ESCAPES = ["..", "../etc", "a/../../b", "/etc/passwd", "a/b", "x;rm -rf /", "$(reboot)",
           "`id`", "a b", "a\nb", "a\x00b", "~root", ".hidden", "A-UPPER", "-flag", ""]


@pytest.mark.parametrize("name", ESCAPES)
def test_workload_names_that_escape_are_refused(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec({"name": name, "command": ["true"]})
    assert info.value.field == "spec.name"


@pytest.mark.parametrize("wid", [*ESCAPES, "train-12345", "train-12345g", "../train-123456"])
def test_checkpoint_paths_are_built_only_from_ids(wid: str) -> None:
    assert not is_workload_id(wid)
    with pytest.raises(ValidationError):
        checkpoint_dir(PurePosixPath("/ck"), wid)


def test_a_real_id_stays_under_the_root() -> None:
    assert checkpoint_dir(PurePosixPath("/ck"), "train-0a1b2c") == PurePosixPath(
        "/ck/train-0a1b2c")


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", "a b", "x;y", "", "a" * 64])
def test_node_names_that_escape_are_refused(name: str) -> None:
    assert not is_node_name(name)
    with pytest.raises(ValidationError) as info:
        parse_config({"node": {"name": name}}, "agent")
    assert info.value.field == "node.name"


@pytest.mark.parametrize(("spec", "field"), [
    ({"command": "python train.py; rm -rf /"}, "spec.command"),
    ({"command": ["python", "a\x00b"]}, "spec.command[1]"),
    ({"env": {"LD_PRELOAD=x": "1"}}, "spec.env.LD_PRELOAD=x"),
    ({"env": {"A": "x\x00y"}}, "spec.env.A"),
    ({"checks": [{"type": "exec", "command": "curl x | sh"}]}, "spec.checks[0].command"),
    ({"node_selector": {"rack": ["r1"]}}, "spec.node_selector.rack"),
    ({"env": "A=1"}, "spec.env"),
    ({"restart": False}, "spec.restart"),
    ({"checkpoint": 0}, "spec.checkpoint"),
])
def test_specs_that_would_reach_a_shell_are_refused(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_spec({"name": "job", "command": ["true"], **spec})
    assert info.value.field == field


def test_commands_are_argv_lists_kept_verbatim() -> None:
    spec = parse_spec({"name": "job", "command": ["echo", "$(id)", "; rm -rf /", "`x`"]})
    assert spec.command == ("echo", "$(id)", "; rm -rf /", "`x`")


def python_files() -> list[Path]:
    files = [p for top in ("hafo", "plugins", "scripts", "benchmarks", "examples")
             for p in (ROOT / top).rglob("*.py")]
    assert len(files) > 50
    return files


def shell_calls(path: Path) -> list[str]:
    """Calls that start a shell: a ``shell`` keyword that is not False, ``os.system``,
    ``os.popen``, ``asyncio.create_subprocess_shell``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if (keyword.arg == "shell" and isinstance(keyword.value, ast.Constant)
                    and keyword.value.value is not False):
                found.append(f"{path}:{node.lineno} shell={keyword.value.value!r}")
            elif keyword.arg == "shell" and not isinstance(keyword.value, ast.Constant):
                found.append(f"{path}:{node.lineno} shell=<expression>")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in (
                "system", "popen", "create_subprocess_shell", "getoutput", "getstatusoutput"):
            found.append(f"{path}:{node.lineno} {func.attr}()")
    return found


def test_no_code_starts_a_shell() -> None:
    assert [call for path in python_files() for call in shell_calls(path)] == []


def test_the_scan_finds_a_shell(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    shell_on = "shell" + "=True"  # spelled apart so that text searches find no such call
    bad.write_text(f"import os, subprocess\nsubprocess.run('x', {shell_on})\nos.system('y')\n")
    assert len(shell_calls(bad)) == 2


@pytest.mark.parametrize("wid", ["../../escape-0a1b2c", "x/../../y", "..", "job"])
def test_the_agent_never_builds_a_path_from_a_bad_id(tmp_path: Path, wid: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from hafo.agent.supervisor import Supervisor
    from hafo.model.cluster import Assignment, Submission

    agent_tmp = tmp_path / "tmp"
    agent_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(agent_tmp))  # where TMPDIRs would be made
    supervisor = Supervisor("n1", tmp_path / "state", tmp_path / "ck")
    spec = parse_spec({"name": "job", "command": ["true"]})
    with pytest.raises(ValidationError):
        supervisor.launch(Assignment(workload=wid, phase="placed", node="n1", epoch=5),
                          Submission(wid, spec, 0.0), [])
    assert not (tmp_path / "state").exists() and not (tmp_path / "ck").exists()
    assert list(tmp_path.parent.glob("escape*")) == [] and list(agent_tmp.iterdir()) == []


@pytest.mark.parametrize(("before", "after"), [("-500", "0"), ("0", "0"), ("300", "300")])
def test_workloads_do_not_inherit_the_agents_oom_protection(tmp_path: Path, before: str,
                                                            after: str) -> None:
    from hafo.agent.guard import _unprotect_from_oom

    score = tmp_path / "oom_score_adj"
    score.write_text(before + "\n")
    _unprotect_from_oom(str(score))
    assert score.read_text().strip() == after
