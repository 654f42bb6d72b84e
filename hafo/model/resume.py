"""Where a workload's next instance resumes, as people read it: the one wording of the events,
the reasons and the demo. Pure.

A checkpoint's ``step`` is the step whose state it holds: an instance that restores checkpoint
step 840 goes on with step 841 (``hafo.local.workload`` logs ``start at step 840``), and
``hafo show`` lists it under RESUMED-FROM as ``step 840``. Who writes the note knows the
resume point exactly or not:

- exactly (``exact``): read from the checkpoint root once the instance that wrote it had
  ended (the agent's ``stopped`` event, a move placed after its instance reported its end):
  ``resumes from checkpoint step 840``;
- as far as reported (a node that died, a stop not yet reported): its agent reports the
  newest checkpoint every few seconds, so newer ones may have been committed since: ``resumes
  from its latest checkpoint (step 820 or newer)``; the epoch's ``resumed_from`` in ``hafo
  show`` then names the step the new instance found.
"""

from __future__ import annotations

from hafo.model.cluster import CheckpointInfo

__all__ = ["resume_note"]


def resume_note(checkpoint: CheckpointInfo | None, *, exact: bool = False) -> str:
    """``resumes from checkpoint step 840`` (``exact``), ``resumes from its latest checkpoint
    (step 820 or newer)`` (as last reported), ``resumes from the start (no checkpoint)``
    (exactly none) or ``resumes from its latest checkpoint, if any`` (none reported)."""
    if checkpoint is None:
        return ("resumes from the start (no checkpoint)" if exact
                else "resumes from its latest checkpoint, if any")
    if exact:
        return f"resumes from checkpoint step {checkpoint.step}"
    return f"resumes from its latest checkpoint (step {checkpoint.step} or newer)"
