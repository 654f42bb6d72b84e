"""Names that end up in etcd keys, URLs and file paths: what they may look like.

Workload ids become directory names under the checkpoint root, so an id is checked here before
any path is built from it (a name such as ``../x`` can never leave the root).
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import TypeVar

from hafo.model.errors import ValidationError

WORKLOAD_NAME = r"[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?"
WORKLOAD_NAME_RE = re.compile(WORKLOAD_NAME)
#: ``<name>-<6 hex>`` (``hafo submit``), and ``<that>.<n>`` for replica n of a service.
WORKLOAD_ID_RE = re.compile(rf"{WORKLOAD_NAME}-[0-9a-f]{{6}}(\.[0-9]{{1,9}})?")
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: A MIG profile: compute slices (1-8), "g.", memory in GB, "gb", optional "+extension"
#: ("1g.10gb", "3g.40gb", "1g.20gb+me"). The one definition: config, specs and the OpenAPI
#: document use it, and ``mig_profile_mib`` reads the memory from it.
MIG_PROFILE = r"([1-8])g\.([1-9][0-9]{0,3})gb(\+[a-z]+)?"
MIG_PROFILE_RE = re.compile(MIG_PROFILE)


def is_workload_id(text: str) -> bool:
    """``<name>-<6 hex>`` as ``hafo submit`` makes them, or a replica's ``<id>.<n>``."""
    return bool(WORKLOAD_ID_RE.fullmatch(text))


def is_node_name(text: str) -> bool:
    """Letters, digits, '.', '_' or '-', at most 63 characters, not starting with '.'."""
    return bool(NODE_NAME_RE.fullmatch(text))


def mig_profile_mib(profile: str) -> int | None:
    """A MIG profile's memory in MiB ("3g.40gb" -> 40960), None if it is not a profile."""
    match = MIG_PROFILE_RE.fullmatch(profile)
    return int(match.group(2)) * 1024 if match else None


def check_workload_id(text: str, field: str = "workload") -> str:
    """``text`` if it is a workload id, else a ValidationError naming ``field``."""
    if not is_workload_id(text):
        raise ValidationError(field, f"not a workload id (NAME-6HEX, or NAME-6HEX.N for a "
                                     f"replica): {text!r}")
    return text


def check_node_name(text: str, field: str = "node") -> str:
    """``text`` if it is a node name, else a ValidationError naming ``field``."""
    if not is_node_name(text):
        raise ValidationError(field, f"not a node name (letters, digits, '.', '_', '-'): "
                              f"{text!r}")
    return text


P = TypeVar("P", bound=PurePath)


def checkpoint_dir(root: P, workload_id: str) -> P:
    """The workload's checkpoint directory: ``root/<id>``, refused for anything but an id."""
    check_workload_id(workload_id)
    return root / workload_id


def is_workload_ref(text: str) -> bool:
    """A workload id, or a name (``hafo status web`` as well as ``hafo status web-1a2b3c``)."""
    return is_workload_id(text) or bool(WORKLOAD_NAME_RE.fullmatch(text))
