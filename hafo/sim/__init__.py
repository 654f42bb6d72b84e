"""``hafo sim``: many simulated agents in one process, for scale tests (docs/design.md, "Scale")."""

from hafo.sim.fleet import SimFleet

__all__ = ["SimFleet"]
