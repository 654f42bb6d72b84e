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

#: The largest YAML file read (the API takes 256 KiB bodies; a config is a few KiB).
MAX_FILE_BYTES = 4 * 1024 * 1024


class YamlRefused(ValueError):
    """The text is not YAML we read: invalid, recursive, or too big once expanded."""


def expanded_size(root: yaml.Node, limit: int = MAX_VALUES) -> int:
    """How many values ``root`` stands for with every alias expanded; YamlRefused past
    ``limit`` or on a recursive alias. Each node is counted once (memoised by identity), so
    the cost is proportional to the composed document, not to its expansion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in open_nodes:
            raise YamlRefused("a recursive alias (an anchor used inside itself)")
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(key) + size(value) for key, value in node.value)
        open_nodes.discard(id(node))
        if total > limit:
            raise YamlRefused(f"it stands for more than {limit:,} values once its aliases "
                              "are expanded (nested aliases: a 'billion laughs' file?)")
        sizes[id(node)] = total
        return total

    return size(root)


def load_yaml_text(text: str, limit: int = MAX_VALUES) -> Any:
    """The document in ``text`` (None when empty), read as ``yaml.safe_load`` would, after
    its expanded size is checked (``expanded_size``). YamlRefused says why it is refused,
    with the line of a syntax error."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)  # libyaml where built
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise YamlRefused(f"invalid YAML{where}") from None
        if node is None:
            return None
        expanded_size(node, limit)
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise YamlRefused(f"invalid YAML{where}") from None
    finally:
        loader.dispose()
