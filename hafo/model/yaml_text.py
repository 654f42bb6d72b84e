"""YAML read from users' files (specs, configs) with bounded cost.

PyYAML builds an alias as a reference to its anchor's node, so a file of a few hundred
bytes with nested aliases (the "billion laughs") loads quickly and then stands for
billions of values: whatever walks the result (validation, JSON encoding) grows without
bound (``hafo submit`` of a 392-byte file reached 5.5 GB). Here the document is composed
first, its size counted with every alias expanded (in time proportional to the file, each
node's size remembered), and refused above ``MAX_VALUES`` before anything is built from it.
"""

from __future__ import annotations

from typing import Any

import yaml

#: The most values (scalars, sequences and mappings, aliases expanded) a file may stand for.
#: A spec or a config has hundreds; a hundred thousand is far past any real one.
MAX_VALUES = 100_000

#: The deepest nesting of sequences and mappings read (a spec or a config has a few levels).
MAX_DEPTH = 64

#: The largest YAML file read (the API takes 256 KiB bodies; a config is a few KiB).
MAX_FILE_BYTES = 4 * 1024 * 1024


class YamlRefused(ValueError):
    """The text is not YAML we read: invalid, recursive, or too big once expanded."""


def expanded_size(root: yaml.Node, limit: int = MAX_VALUES, depth: int = MAX_DEPTH) -> int:
    """How many values ``root`` stands for with every alias expanded; YamlRefused past
    ``limit``, nested deeper than ``depth`` or on a recursive alias. Each node is counted once
    (memoised by identity), so the cost is proportional to the composed document, not to its
    expansion; the walk keeps its own stack (no recursion limit to hit)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]  # (node, its children counted)
    while stack:
        node, counted = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if not counted:
            if isinstance(node, yaml.MappingNode):
                _no_duplicate_keys(node)
            if id(node) in open_nodes:
                raise YamlRefused("a recursive alias (an anchor used inside itself)")
            if len(open_nodes) >= depth:
                raise YamlRefused(f"it is nested more than {depth} levels deep")
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        open_nodes.discard(id(node))
        total = 1 + sum(sizes[id(child)] for child in children)
        if total > limit:
            raise YamlRefused(f"it stands for more than {limit:,} values once its aliases "
                              "are expanded (nested aliases: a 'billion laughs' file?)")
        sizes[id(node)] = total
    return sizes[id(root)]


def _no_duplicate_keys(node: yaml.MappingNode) -> None:
    """YamlRefused when one mapping gives a key twice (PyYAML would keep the last silently:
    ``gpus: 1`` then ``gpus: 8`` must not quietly mean 8)."""
    seen: dict[str, int] = {}
    for key, _value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            continue
        line = key.start_mark.line + 1
        if key.value in seen:
            raise YamlRefused(f"the key {key.value!r} is given twice in one mapping (lines "
                              f"{seen[key.value]} and {line})")
        seen[key.value] = line


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _refused(exc: yaml.YAMLError) -> YamlRefused:
    """A parser's or constructor's error as one line with its line number."""
    mark = getattr(exc, "problem_mark", None)
    return YamlRefused(f"invalid YAML{f' at line {mark.line + 1}' if mark else ''}")


def load_yaml_text(text: str, limit: int = MAX_VALUES) -> Any:
    """The document in ``text`` (None when empty), read as ``yaml.safe_load`` would, after
    its expanded size is checked (``expanded_size``). YamlRefused says why it is refused,
    with the line of a syntax error."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)  # libyaml where built
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            raise _refused(exc) from None
        if node is None:
            return None
        expanded_size(node, limit)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            raise _refused(exc) from None
    finally:
        loader.dispose()
