"""Each instance's private temporary directory (its ``TMPDIR``), removed with the instance.

Tools a workload runs leave files in the temporary directory that nobody removes when the
process is killed: torchrun creates a ``torchelastic_*`` directory per run, compilers and
data loaders leave theirs. A node that runs a gang epoch after epoch would collect them
forever. So unless the spec's ``env`` sets ``TMPDIR``, the agent makes one directory per
instance under its own temporary directory (``$TMPDIR`` of the agent, else ``/tmp``), named
``hafo-<workload>.<epoch>-<random>``, passes it as ``TMPDIR``, records it in the launch file,
and removes it when it forgets the instance (docs/contract.md, "What a workload gets").
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from hafo.agent.instances import InstanceKey

log = structlog.get_logger("hafo.agent")

PREFIX = "hafo-"


def make_tmpdir(key: InstanceKey, spec_env: Mapping[str, str]) -> Path | None:
    """A new private temporary directory for ``key`` (mode 0700), or None when the spec's
    ``env`` chose the workload's ``TMPDIR`` itself, or when none can be made (a full or
    read-only disk: the workload then inherits the agent's ``TMPDIR``, with a warning)."""
    if "TMPDIR" in spec_env:
        return None
    try:
        return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{key.dirname}-"))
    except OSError as exc:
        log.warning("no private TMPDIR for the instance: it shares the agent's",
                    workload=key.workload, epoch=key.epoch, error=str(exc))
        return None


def remove_tmpdir(launch: Mapping[str, Any]) -> None:
    """Remove the directory a launch file names as ``tmpdir`` (made by ``make_tmpdir``), with
    everything the workload left in it. A name that ``make_tmpdir`` cannot have made (an
    edited launch file) is left alone."""
    raw = launch.get("tmpdir")
    if not isinstance(raw, str) or not raw:
        return
    path = Path(raw)
    workload, epoch = launch.get("workload"), launch.get("epoch")
    expected = f"{PREFIX}{workload}.{epoch}-"
    if not path.is_absolute() or not path.name.startswith(expected) or path.is_symlink():
        return
    shutil.rmtree(path, ignore_errors=True)
