"""Controllers: leader election and the reconcile loop (snapshot -> decisions -> store)."""
