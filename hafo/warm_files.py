"""Reading and writing the warm protocol's files (``hafo.model.warm``): shared by the SDK's side
(``hafo.checkpoint.warm``) and the guard's (``hafo.agent.warm_member``), and kept apart from
the SDK so that the guard starts without importing it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from hafo.model.warm import MAX_FILE_BYTES

__all__ = ["read_protocol_file", "write_protocol_file"]


def read_protocol_file(path: Path) -> str | None:
    """A protocol file's text (at most ``MAX_FILE_BYTES``); None if it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


def write_protocol_file(path: Path, text: str) -> None:
    """Replace a protocol file with ``text`` atomically (a rename)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
