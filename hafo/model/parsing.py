"""Small typed readers for untrusted mappings (YAML, JSON bodies), raising ValidationError."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hafo.model.errors import ValidationError


def as_mapping(value: Any, field: str) -> Mapping[str, Any]:
    """Return ``value`` if it is a mapping with string keys."""
    if not isinstance(value, Mapping):
        raise ValidationError(field, f"must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise ValidationError(field, f"keys must be strings, got {key!r}")
    return value


def reject_unknown(data: Mapping[str, Any], allowed: set[str], field: str) -> None:
    """Raise for the first key of ``data`` that is not in ``allowed``."""
    for key in data:
        if key not in allowed:
            where = f"{field}.{key}" if field else key
            raise ValidationError(where, f"unknown field (allowed: {', '.join(sorted(allowed))})")


def get_str(data: Mapping[str, Any], key: str, field: str, default: str | None = None,
            required: bool = False) -> str | None:
    """Read an optional (or required) non-empty string."""
    where = f"{field}.{key}" if field else key
    if key not in data or data[key] is None:
        if required:
            raise ValidationError(where, "is required")
        return default
    value = data[key]
    if not isinstance(value, str) or not value:
        raise ValidationError(where, "must be a non-empty string")
    return value


def get_int(data: Mapping[str, Any], key: str, field: str, default: int,
            minimum: int | None = None, maximum: int | None = None) -> int:
    """Read an integer within bounds (booleans are refused)."""
    where = f"{field}.{key}" if field else key
    value = data.get(key, default)
    if value is None:
        value = default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON Schema's integers include 1.0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(where, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValidationError(where, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValidationError(where, f"must be <= {maximum}, got {value}")
    return value


def get_number(data: Mapping[str, Any], key: str, field: str, default: float,
               minimum: float | None = None, exclusive_minimum: bool = False) -> float:
    """Read an int or float, at least ``minimum`` (or above it when exclusive)."""
    where = f"{field}.{key}" if field else key
    value = data.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(where, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValidationError(where, f"must be a finite number, got {value!r}")
    if minimum is not None:
        if exclusive_minimum and value <= minimum:
            raise ValidationError(where, f"must be > {minimum}, got {value}")
        if not exclusive_minimum and value < minimum:
            raise ValidationError(where, f"must be >= {minimum}, got {value}")
    return float(value)


def get_str_map(data: Mapping[str, Any], key: str, field: str) -> dict[str, str]:
    """Read a mapping of strings to scalars, returned as strings."""
    where = f"{field}.{key}" if field else key
    value = data.get(key)
    mapping = as_mapping({} if value is None else value, where)
    out: dict[str, str] = {}
    for k, v in mapping.items():
        if not isinstance(k, str) or not k or "\x00" in k or "=" in k:
            raise ValidationError(f"{where}.{k}", "keys must be non-empty strings without "
                                  "'=' or NUL")
        if isinstance(v, bool | int | float | str):
            text = str(v).lower() if isinstance(v, bool) else str(v)
            if "\x00" in text:
                raise ValidationError(f"{where}.{k}", "must not contain a NUL character")
            out[k] = text
        else:
            raise ValidationError(f"{where}.{k}", "must be a string or number")
    return out


def get_argv(data: Mapping[str, Any], key: str, field: str, required: bool = True) -> list[str]:
    """Read an argv list: a non-empty list of strings (never a shell string)."""
    where = f"{field}.{key}" if field else key
    value = data.get(key)
    if value is None:
        if required:
            raise ValidationError(where, "is required (a list of strings, e.g. [python, train.py])")
        return []
    if isinstance(value, str) or not isinstance(value, list) or not value:
        raise ValidationError(where, "must be a non-empty list of strings (argv, no shell)")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ValidationError(f"{where}[{i}]", "must be a non-empty string")
        if "\x00" in item:
            raise ValidationError(f"{where}[{i}]", "must not contain a NUL character")
    return list(value)
