"""The README as a newcomer meets it (issue 31): short, the two set-up commands, links into the
documentation site, and no re-measurement diary (each figure once, in docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= 250


def test_the_two_setup_commands_are_the_first_commands() -> None:
    first = re.search(r"```sh\n(.*?)```", README, re.DOTALL)
    assert first is not None
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["make demo", "make test"]


def test_it_links_into_every_part_of_the_site() -> None:
    for page in ("docs/getting-started/quickstart.md", "docs/concepts/queues.md",
                 "docs/guides/torchrun.md", "docs/guides/haproxy.md", "docs/guides/ansible.md",
                 "docs/reference/index.md", "docs/safety.md", "docs/benchmarks.md"):
        assert f"]({page}" in README, f"the README does not link {page}"
        assert (REPO / page).is_file(), page


def test_no_re_measurement_diary() -> None:
    for words in ("Re-measured", "re-measured", "A rerun", "earlier that day"):
        assert words not in README, words
