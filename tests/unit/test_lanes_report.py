"""The lanes runner's closing report (``scripts/test_lanes.py``): each failed test with the
head and tail of its message, read from a real pytest JUnit report."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("test_lanes_runner",
                                                  ROOT / "scripts" / "test_lanes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_failures_name_each_failed_test_with_its_message_head_and_tail(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "def test_ok():\n    pass\n\n"
        "def test_bad():\n    assert 1 == 2, 'START' + 'x' * 3000 + 'END'\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    f"--junitxml={tmp_path / 'unit.xml'}", "-o", "junit_family=xunit1",
                    str(tmp_path / "test_sample.py")], cwd=tmp_path, capture_output=True,
                   check=False, timeout=120)
    runner = _runner()
    runner.OUT = tmp_path
    found = runner.failures(["unit", "absent-lane"])
    assert len(found) == 1
    text = found[0]
    assert text.startswith("[unit] ") and "test_bad (failure)" in text
    assert "START" in text and "END" in text and "characters ..." in text
    assert len(text) < 2000
