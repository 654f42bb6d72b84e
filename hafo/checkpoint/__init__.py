"""Checkpoint SDK for workloads: atomic, checksummed, epoch-fenced save and restore."""

from hafo.checkpoint.format import CheckpointRef, list_checkpoints
from hafo.checkpoint.sdk import Checkpointer, Restored

__all__ = ["CheckpointRef", "Checkpointer", "Restored", "list_checkpoints"]
