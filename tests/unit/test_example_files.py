"""Every file in examples/ is valid: configs parse for their role, specs parse and their
checks load with their check types."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hafo.checks.registry import load_check
from hafo.model.config import parse_config
from hafo.model.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = {"agent.yaml": "agent", "controller.yaml": "controller"}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_is_valid(name: str) -> None:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    if name in CONFIGS:
        parse_config(raw, CONFIGS[name])
        return
    spec = parse_spec(raw)
    for check in spec.checks:
        assert load_check(check.type, check.options) is not None
