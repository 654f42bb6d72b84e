"""Placement strategies: how new work is spread over the healthy GPUs (``scheduler.strategy``
in the controller's config, ``strategy`` in a spec). Its own module so that loading a config
does not build the spec's models."""

from __future__ import annotations

from typing import Literal

Strategy = Literal["spread", "binpack"]
STRATEGIES: tuple[Strategy, ...] = ("spread", "binpack")
