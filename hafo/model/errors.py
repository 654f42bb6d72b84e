"""The one error type for bad input: it names the offending field (every one of them)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    """One bad field: its dotted path and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    def to_dict(self) -> dict[str, str]:
        """``{"field", "error"}`` (the API's ``errors`` items)."""
        return {"field": self.field, "error": self.message}


class ValidationError(ValueError):
    """Bad user input (config, workload spec, HTTP body, CLI argument).

    ``field`` is a dotted path such as ``spec.restart.max_restarts`` and ``message`` what is
    wrong with it: the first error. ``errors`` holds every error found (the first one
    included); ``str(err)`` is one line per error, the first line being the first error.
    """

    def __init__(self, field: str, message: str, more: Sequence[FieldError] = ()) -> None:
        self.field = field
        self.message = message
        self.errors: tuple[FieldError, ...] = (FieldError(field, message), *more)
        super().__init__("\n".join(str(e) for e in self.errors))

    @classmethod
    def of(cls, errors: Sequence[FieldError]) -> ValidationError:
        """One error holding ``errors`` (at least one), in that order."""
        first, *more = errors
        return cls(first.field, first.message, more)

    def lines(self, prefix: str = "") -> list[str]:
        """Each error as a line, after ``prefix`` (e.g. ``"spec.yaml: "``)."""
        return [f"{prefix}{e}" for e in self.errors]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"did you mean 'gpus'?"`` for the known word closest to ``word``, "" if none is
    close (``difflib``'s ratio of at least 0.6)."""
    close = difflib.get_close_matches(word, sorted(known), n=1)
    return f"did you mean {close[0]!r}?" if close else ""
