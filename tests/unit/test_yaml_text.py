"""Users' YAML read with bounded cost (hafo.model.yaml_text): a billion-laughs file is
refused in milliseconds, before anything walks its expansion; ordinary anchors still work."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hafo.model.yaml_text import MAX_VALUES, YamlRefused, expanded_size, load_yaml_text

LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]"
       for i in range(8)])  # 9^9 = 387 million strings from 400 bytes


def test_a_billion_laughs_is_refused_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(YamlRefused, match="more than 100,000 values"):
        load_yaml_text(LAUGHS)
    assert time.monotonic() - started < 1.0
    assert len(LAUGHS) < 500


@pytest.mark.parametrize(("text", "expected"), [
    ("", None),
    ("# only a comment\n", None),
    ("name: x\ncommand: [a, b]\n", {"name": "x", "command": ["a", "b"]}),
    # an anchor and a merge, as configs use them
    ("base: &b {gpus: 1}\nw: {<<: *b, name: w}\n",
     {"base": {"gpus": 1}, "w": {"gpus": 1, "name": "w"}}),
])
def test_ordinary_yaml_reads_as_safe_load_does(text: str, expected: object) -> None:
    assert load_yaml_text(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("a: [1, 2\n", "invalid YAML at line 2"),
    ("a: &x [*x]\n", "invalid YAML|recursive alias"),
    ("a: !!python/object:os.system x\n", "invalid YAML"),
    ("a: 1\n---\nb: 2\n", "invalid YAML"),  # one document per file
])
def test_bad_yaml_is_one_reason(text: str, why: str) -> None:
    with pytest.raises(YamlRefused, match=why):
        load_yaml_text(text)


def test_the_count_is_exact_and_linear() -> None:
    import yaml

    node = yaml.compose("a: &a [1, 2]\nb: [*a, *a]\n")
    # mapping 1 + a 1 + [1,2] 3 + b 1 + [*a,*a] 1 + 3 + 3 = 13
    assert expanded_size(node) == 13
    wide = "x: [" + ", ".join(str(i) for i in range(MAX_VALUES)) + "]\n"
    with pytest.raises(YamlRefused):
        load_yaml_text(wide)


def test_hafo_submit_refuses_the_file_in_one_line_with_bounded_memory(tmp_path: Path) -> None:
    spec = tmp_path / "laughs.yaml"
    spec.write_text(LAUGHS + "\n")

    def limit() -> None:  # 1 GiB: the old path grew to 5.5 GB
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hafo", "submit", str(spec), "--etcd",
                           "http://127.0.0.1:1"], capture_output=True, text=True,
                          timeout=60, preexec_fn=limit)
    assert time.monotonic() - started < 30
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "laughs.yaml" in lines[0] and "aliases" in lines[0], lines


@pytest.mark.parametrize("depth", [65, 500, 50_000])
def test_deep_nesting_is_one_reason_not_a_recursion_error(depth: int) -> None:
    with pytest.raises(YamlRefused, match=r"invalid YAML|nested more than 64 levels"):
        load_yaml_text("a: " + "[" * depth + "]" * depth + "\n")
    assert load_yaml_text("a: " + "[" * 60 + "]" * 60 + "\n") is not None


def test_a_key_given_twice_is_refused_naming_it_and_its_lines() -> None:
    """PyYAML keeps the last of two equal keys; a user's ``gpus: 1`` then ``gpus: 8`` must
    not quietly mean 8. Merge keys (``<<``) are not duplicates."""
    with pytest.raises(YamlRefused, match=r"the key 'gpus' is given twice in one mapping "
                                          r"\(lines 2 and 4\)"):
        load_yaml_text("name: x\ngpus: 1\ncommand: [a]\ngpus: 8\n")
    with pytest.raises(YamlRefused, match="'b' is given twice"):
        load_yaml_text("a: {b: 1, b: 2}\n")
    assert load_yaml_text("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n") == {
        "a": {"b": 1}, "c": {"b": 1, "d": 2}}
