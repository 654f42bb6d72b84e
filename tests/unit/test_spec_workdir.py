"""`hafo submit FILE` makes a relative ``workdir`` absolute against FILE's directory (pure)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hafo.commands.base import resolve_workdir


@pytest.mark.parametrize(("raw", "spec_path", "expected"), [
    pytest.param({"name": "a", "workdir": ".."}, "/repo/examples/train.yaml",
                 {"name": "a", "workdir": "/repo"}, id="parent-of-the-spec-file"),
    pytest.param({"workdir": "."}, "/repo/examples/train.yaml", {"workdir": "/repo/examples"},
                 id="the-spec-file-directory"),
    pytest.param({"workdir": "sub/dir/"}, "/specs/x.yaml", {"workdir": "/specs/sub/dir"},
                 id="below"),
    pytest.param({"workdir": "/srv/job"}, "/specs/x.yaml", {"workdir": "/srv/job"},
                 id="absolute-unchanged"),
    pytest.param({"name": "a"}, "/specs/x.yaml", {"name": "a"}, id="no-workdir-unchanged"),
    pytest.param({"workdir": None}, "/specs/x.yaml", {"workdir": None}, id="null-unchanged"),
    pytest.param({"workdir": 3}, "/specs/x.yaml", {"workdir": 3}, id="not-a-string-left-to-parser"),
    pytest.param({"workdir": ""}, "/specs/x.yaml", {"workdir": ""}, id="empty-left-to-parser"),
    pytest.param(["not", "a", "mapping"], "/specs/x.yaml", ["not", "a", "mapping"],
                 id="not-a-mapping-left-to-parser"),
])
def test_resolve_workdir(raw: Any, spec_path: str, expected: Any) -> None:
    assert resolve_workdir(raw, spec_path) == expected


def test_a_relative_spec_path_is_taken_from_the_current_directory() -> None:
    got = resolve_workdir({"workdir": ".."}, "examples/train.yaml")
    assert got == {"workdir": os.getcwd()}
    assert Path(got["workdir"]).is_absolute()


def test_the_input_is_not_modified() -> None:
    raw = {"workdir": ".."}
    resolve_workdir(raw, "/a/b.yaml")
    assert raw == {"workdir": ".."}
