"""Chaos suite: seeded real faults against a local cluster, with invariants checked."""
