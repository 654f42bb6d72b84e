"""Checkpoint SDK for workloads: atomic, checksummed, epoch-fenced save and restore."""

from hafo.checkpoint.errors import CheckpointMismatch, CheckpointWriteFailed, CorruptCheckpoint
from hafo.checkpoint.format import CheckpointRef, list_checkpoints
from hafo.checkpoint.sdk import Checkpointer, Restored
from hafo.checkpoint.sharded import ShardedCheckpointer as ShardedCheckpointer
from hafo.checkpoint.tiered import TieredCheckpointer as TieredCheckpointer
from hafo.checkpoint.warm import ParkRequested, WarmEpoch
from hafo.checkpoint.warm import run as run_warm

__all__ = ["CheckpointMismatch", "CheckpointRef", "CheckpointWriteFailed", "Checkpointer",
           "CorruptCheckpoint", "ParkRequested", "Restored", "WarmEpoch", "list_checkpoints",
           "run_warm"]
