"""hafo: high-availability failover for GPU clusters."""

__version__ = "0.1.0"
