"""``hafo --version`` and shell completion, through the installed ``hafo`` command and a real
bash (zsh where installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hafo import __version__

HAFO = str(Path(sys.executable).with_name("hafo"))


def _hafo(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HAFO, *argv], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


def test_version_prints_the_package_version() -> None:
    done = _hafo("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"hafo {__version__}"


def test_completion_refuses_an_unknown_shell_in_one_line() -> None:
    done = _hafo("completion", "fish")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "invalid choice: 'fish'" in done.stderr


def _bash_complete(line: str, tmp_path: Path) -> list[str]:
    """What bash offers after ``line`` with hafo's completion script sourced."""
    script = tmp_path / "hafo.bash"
    script.write_text(_hafo("completion", "bash").stdout)
    words = line.split(" ")
    program = f"""
source {script}
COMP_LINE={line!r}
COMP_POINT={len(line)}
COMP_WORDS=({" ".join(repr(w) for w in words)})
COMP_CWORD={len(words) - 1}
_python_argcomplete hafo
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    env = {**os.environ, "PATH": f"{Path(HAFO).parent}:{os.environ['PATH']}",
           # no etcd here: the name completers give up at once
           "HAFO_ETCD": "http://127.0.0.1:9", "HAFO_CLUSTER": "nosuch"}
    done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stderr
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_bash_completes_subcommands(tmp_path: Path) -> None:
    assert set(_bash_complete("hafo dr", tmp_path)) == {"drain"}
    offered = set(_bash_complete("hafo ", tmp_path))
    assert {"submit", "workloads", "drain", "migrate", "completion"} <= offered


def test_bash_completes_flags_of_a_subcommand(tmp_path: Path) -> None:
    offered = set(_bash_complete("hafo migrate x --", tmp_path))
    assert {"--to", "--from", "--etcd", "--cluster"} <= offered


def test_completion_without_etcd_offers_no_names_and_no_error(tmp_path: Path) -> None:
    offered = _bash_complete("hafo drain ", tmp_path)
    assert all(word.startswith("-") for word in offered), offered  # flags only, no names


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_script_parses(tmp_path: Path) -> None:
    script = tmp_path / "_hafo"
    script.write_text(_hafo("completion", "zsh").stdout)
    done = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
