"""The errors of the checkpoint SDK."""

from __future__ import annotations


class CorruptCheckpoint(Exception):
    """A checkpoint whose manifest or blobs do not verify."""


class CheckpointMismatch(ValueError):
    """A checkpoint whose layout (keys, types, dtypes, shapes) differs from the state that
    ``Checkpointer.load_into`` was asked to restore it into; the message names the key."""
