"""Checkpoint SDK for workloads: atomic, checksummed, epoch-fenced save and restore."""

from hafo.checkpoint.errors import CheckpointMismatch, CheckpointWriteFailed, CorruptCheckpoint
from hafo.checkpoint.format import CheckpointRef, list_checkpoints
from hafo.checkpoint.sdk import Checkpointer, Restored
from hafo.checkpoint.sharded import ShardedCheckpointer as ShardedCheckpointer
from hafo.checkpoint.tiered import TieredCheckpointer as TieredCheckpointer

__all__ = ["CheckpointMismatch", "CheckpointRef", "CheckpointWriteFailed", "Checkpointer",
           "CorruptCheckpoint", "Restored", "list_checkpoints"]
