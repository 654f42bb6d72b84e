"""Node daemon: heartbeat and self-fencing, inventory and health, guards and workloads."""
