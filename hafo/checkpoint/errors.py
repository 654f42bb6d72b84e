"""The errors of the checkpoint SDK."""

from __future__ import annotations

import errno


class CorruptCheckpoint(Exception):
    """A checkpoint whose manifest or blobs do not verify."""


class CheckpointMismatch(ValueError):
    """A checkpoint whose layout (keys, types, dtypes, shapes) differs from the state that
    ``Checkpointer.load_into`` was asked to restore it into; the message names the key."""


class CheckpointWriteFailed(OSError, RuntimeError):
    """A checkpoint that could not be written (the filesystem full, read-only, gone): the
    earlier checkpoints are kept and the workload keeps running; ``errno`` is the OS error's.
    An ``OSError`` (what the write raised) and a ``RuntimeError`` (what a failed background
    write raised before)."""


def write_failed(root: object, step: int, exc: OSError, background: bool = False
                 ) -> CheckpointWriteFailed:
    """The error a workload is told when its checkpoint of ``step`` into ``root`` failed,
    e.g. ``checkpoint of step 7 not written to /ckpt: No space left on device (the
    checkpoint filesystem is full); earlier checkpoints are kept``."""
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        what += " (the checkpoint filesystem is full)"
    elif exc.errno == errno.EROFS:
        what += " (the checkpoint filesystem is read-only)"
    prefix = "previous background checkpoint failed: " if background else ""
    message = (f"{prefix}checkpoint of step {step} not written to {root}: {what}; earlier "
               "checkpoints are kept")
    error = CheckpointWriteFailed(message)
    error.errno = exc.errno
    error.__cause__ = exc
    return error
