"""Reading the YAML files a user hands to ``hafo``: a workload spec or a daemon config, with
bounded memory and time, every failure one line naming the file (``hafo.exits.CliError``)."""

from __future__ import annotations

from typing import Any

from hafo.exits import EXIT_USAGE, CliError


def load_yaml(path: str, what: str) -> Any:
    """A spec's or a config's YAML, read with bounded memory and time
    (``hafo.model.yaml_text``): one line naming the file when it cannot be read, is too
    big, or is not YAML we read."""
    from hafo.model.yaml_text import MAX_FILE_BYTES, YamlRefused, load_yaml_text

    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CliError(f"{what} file not found: {path}", EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path}: {exc.strerror}", EXIT_USAGE) from None
    if len(data) > MAX_FILE_BYTES:
        raise CliError(f"{path}: over {MAX_FILE_BYTES // (1024 * 1024)} MiB; a {what} file "
                       "is a few KiB", EXIT_USAGE)
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise CliError(f"{path}: not UTF-8 text (byte {exc.start})", EXIT_USAGE) from None
    try:
        return load_yaml_text(text)
    except YamlRefused as exc:
        raise CliError(f"{path}: {exc}", EXIT_USAGE) from None


def load_config(path: str, role: str) -> Any:
    """Read and validate a daemon config file."""
    from hafo.model import ValidationError, parse_config

    raw = load_yaml(path, "config")
    if raw is None:
        raise CliError(f"{path}: the file is empty (a config is a mapping: see "
                       "docs/reference/config-files.md, \"Config files\")", EXIT_USAGE)
    try:
        return parse_config(raw, role)
    except ValidationError as exc:
        raise CliError("\n".join(exc.lines(f"{path}: ")), EXIT_USAGE) from None
