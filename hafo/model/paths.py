"""Default paths on a node (``node.state_dir``, ``checkpoint.root``): a module of its own so
that a restarting agent finds its state directory without building the config models
(``hafo.agent.renewal_brief``)."""

DEFAULT_STATE_DIR = "/var/lib/hafo"
DEFAULT_CHECKPOINT_ROOT = "/var/lib/hafo/checkpoints"
#: Where a node's workloads keep snapshots in RAM (``node.memory_dir``).
DEFAULT_MEMORY_DIR = "/dev/shm/hafo"
