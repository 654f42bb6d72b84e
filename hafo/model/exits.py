"""How an instance's exit reads for people: its exit code and the line of its stderr that says
most (``exited with code 1 on n1: ModuleNotFoundError: No module named 'torch'``). Pure.

The guard keeps the last lines of a workload's stderr (``hafo.model.output.tail_text``: at
most ``TAIL_LINES`` lines and ``TAIL_BYTES`` bytes) and its agent reports them with the exited
instance (``InstanceStatus.stderr_tail``). The controller quotes one line of them, bounded, in
the reasons and events it writes (``stderr_line``).
"""

from __future__ import annotations

import re
import unicodedata

from hafo.model.output import TAIL_BYTES

#: The most characters of stderr a reason or an event quotes.
STDERR_LINE_CHARS = 200

#: Terminal escape sequences (colours, cursor moves): dropped from a quoted line.
_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_SPACES = re.compile(r"\s+")


def bounded_tail(text: str, limit: int = TAIL_BYTES) -> str:
    """``text``'s last ``limit`` bytes (as UTF-8), cut at a character boundary: what an
    instance report carries at most."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[-limit:].decode("utf-8", "ignore")


def one_line(text: str, limit: int = STDERR_LINE_CHARS) -> str:
    """``text`` as one printable line of at most ``limit`` characters: terminal escape
    sequences dropped, control characters and runs of white space as one space, cut with
    "..." when longer."""
    text = _ESCAPES.sub("", text)
    text = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > limit:
        return text[:max(0, limit - 3)].rstrip() + "..."
    return text


def stderr_line(tail: str, limit: int = STDERR_LINE_CHARS) -> str:
    """The line of a stderr tail that says most: its last line with anything printable on it
    (what a failing program prints last: Python's exception, a fatal error), as
    ``one_line``; "" when there is none. A carriage return starts a line too, so of a
    progress bar only its last state counts."""
    for line in reversed(tail.splitlines()):
        text = one_line(line, limit)
        if text:
            return text
    return ""


def failure_subject(what: str, node: str, detail: str = "") -> str:
    """What failed where, and what it said: ``exited with code 1 on n1: ValueError: bad``
    (``detail``: a quoted line of stderr, "" for none)."""
    return f"{what} on {node}: {detail}" if detail else f"{what} on {node}"
