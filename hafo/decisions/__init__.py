"""Pure, synchronous, deterministic decisions over a frozen snapshot and an injected ``now``."""
