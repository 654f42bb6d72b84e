"""Each workload's private temporary directory on a node (its instances' ``TMPDIR``), removed
when the workload leaves the node.

Tools a workload runs leave files in the temporary directory that nobody removes when the
process is killed: torchrun creates a ``torchelastic_*`` directory per run, and a node that
runs a gang epoch after epoch collected one per epoch forever. So unless the spec's ``env``
sets ``TMPDIR``, the agent gives the workload ``<agent's temporary directory>/hafo-tmp.<id>``
(mode 0700; the agent's ``$TMPDIR``, else ``/tmp``) and removes it when it forgets the
workload's last instance on the node (a workload restarted in place, a new epoch launched
before its previous one is forgotten, keeps it). Caches meant to outlive workloads stay
where they were: torch.compile's (``torchinductor_<user>``, which PyTorch keeps in
``TMPDIR``) is pointed back at the agent's temporary directory with
``TORCHINDUCTOR_CACHE_DIR``, so a gang restarted after a failure does not compile from
scratch (docs/reference/workloads.md, "What a workload gets").
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

import structlog

log = structlog.get_logger("hafo.agent")

PREFIX = "hafo-tmp."


def tmpdir_name(workload: str) -> str:
    """The directory's name for ``workload`` (an id ``hafo submit`` made)."""
    return f"{PREFIX}{workload}"


def make_tmpdir(workload: str, spec_env: Mapping[str, str]) -> Path | None:
    """The workload's private temporary directory, made if missing (mode 0700); None when the
    spec's ``env`` chose ``TMPDIR`` itself, or when it cannot be had (a full or read-only
    disk, or the name taken by something that is not this user's directory: the instance
    then inherits the agent's ``TMPDIR``, with a warning)."""
    if "TMPDIR" in spec_env:
        return None
    path = Path(tempfile.gettempdir()) / tmpdir_name(workload)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise OSError(f"{path} exists and is not a directory of this user")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(path, 0o700)
    except OSError as exc:
        log.warning("no private TMPDIR for the workload: it shares the agent's",
                    workload=workload, error=str(exc))
        return None
    return path


def kept_caches(agent_env: Mapping[str, str]) -> dict[str, str]:
    """Variables that keep tools' shared caches in the agent's temporary directory when the
    workload's ``TMPDIR`` is its own (the spec's ``env`` may still set them): torch.compile's
    cache, at the path PyTorch would have used (``torchinductor_<user>``)."""
    if "TORCHINDUCTOR_CACHE_DIR" in agent_env:
        return {}
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    name = "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    return {"TORCHINDUCTOR_CACHE_DIR": str(Path(tempfile.gettempdir()) / name)}


def remove_tmpdir(workload: str, recorded: object = None) -> None:
    """Remove ``workload``'s private temporary directory with everything in it; call it once
    the workload has no other instance on the node. ``recorded`` is the launch file's
    ``tmpdir`` (the agent's temporary directory may have changed since); the default place
    is tried too (an instance that never started records none). Only a directory of this
    user with the name ``make_tmpdir`` gives the workload is removed: never a symlink,
    another user's directory or another path an edited launch file names."""
    paths = {Path(tempfile.gettempdir()) / tmpdir_name(workload)}
    if isinstance(recorded, str) and recorded and Path(recorded).is_absolute():
        paths.add(Path(recorded))
    for path in paths:
        if path.name != tmpdir_name(workload):
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
