"""One declaration per external format: pydantic v2 over the frozen dataclasses of hafo.model.

A format is declared once, as a frozen dataclass whose fields carry their constraints
(``Annotated[int, Field(ge=0), INTEGER]``). ``Schema`` validates untrusted input into that
very dataclass, dumps it to its JSON form and writes its JSON Schema (2020-12, what OpenAPI
3.1 uses). Every failure becomes the one ``ValidationError``: every error, each naming its
field by its dotted path (``spec.restart.window``, ``spec.command[1]``), the first one first.

Two kinds of declarations:

- ``Section``: what people write (config file, workload spec, check options). Unknown keys
  are refused first (``unknown field, did you mean 'gpus'? (allowed: ...)``), with the
  section's other errors after them, ``null`` is the same as leaving the
  key out, and ``_check`` holds the rules between fields.
- ``Record``: what hafo writes to etcd itself. Unknown keys are ignored (a newer writer may
  add some); ``to_dict`` and ``from_dict`` are derived from the declaration.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Generic, NoReturn, Self, TypeVar

from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    TypeAdapter,
)
from pydantic import ValidationError as PydanticError
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import (
    CoreSchema,
    InitErrorDetails,
    PydanticCustomError,
    SchemaValidator,
    core_schema,
)

from hafo.model.errors import FieldError, ValidationError, did_you_mean
from hafo.model.names import MIG_PROFILE, NODE_NAME_RE, WORKLOAD_NAME

T = TypeVar("T")
Loc = tuple[int | str, ...]

__all__ = ["INTEGER", "OMIT_DEFAULT", "Arg", "Argv", "Expect", "Flag", "JsonOf", "Matches",
           "MigProfile", "NodeName", "NonNegative", "Number", "OneOrMore", "Positive", "Record",
           "ScalarText", "Schema", "Section", "StrMap", "Text", "WorkloadName", "integral",
           "invalid", "json_schemas", "schema_of"]


# --- errors -------------------------------------------------------------------------------

def invalid(loc: str | Loc, message: str, value: Any = None) -> NoReturn:
    """Fail validation at ``loc`` (relative to the value being validated) with ``message``.

    Meant for validators and ``Section._check``: pydantic prefixes the location with where
    that value sits, so the error names the full dotted path."""
    where: Loc = (loc,) if isinstance(loc, str) else loc
    raise PydanticError.from_exception_data("hafo", [InitErrorDetails(
        type=PydanticCustomError("hafo", message), loc=where, input=value)])


def _show(value: Any) -> str:
    if isinstance(value, Mapping | list | tuple | set) or value is None:
        return type(value).__name__
    return repr(value)


def _num(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


_KINDS = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
          "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
          "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
          "tuple_type": "a list", "iterable_type": "a list", "dict_type": "a mapping",
          "mapping_type": "a mapping", "dataclass_type": "a mapping",
          "dataclass_exact_type": "a mapping", "model_type": "a mapping"}


def _message(error: Mapping[str, Any]) -> str:
    """hafo's wording of one pydantic error (the constraint, and the value when it helps)."""
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind in _KINDS:
        return f"must be {_KINDS[kind]}, got {_show(value)}"
    simple = {"missing": "is required", "finite_number": f"must be a finite number, got {value!r}",
              "unexpected_keyword_argument": "unknown field", "extra_forbidden": "unknown field",
              "string_too_short": "must be a non-empty string"}
    if kind in simple:
        return simple[kind]
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
              "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
    if kind in bounds:
        op, key = bounds[kind]
        return f"must be {op} {_num(ctx.get(key))}, got {_num(value)!r}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}"
    if kind in ("literal_error", "enum"):
        return f"must be {ctx.get('expected')}, got {value!r}"
    if kind == "string_pattern_mismatch":
        what = _PATTERN_MESSAGES.get(ctx.get("pattern", ""), "must match " + ctx.get("pattern", ""))
        return f"{what}, got {value!r}"
    text = str(error["msg"])  # pydantic's own wording
    return text.removeprefix("Value error, ")


def field_path(prefix: str, loc: Loc, root: str) -> str:
    """``prefix`` + ``loc`` as hafo writes it: ``a.b[0].c`` (``root`` for the value itself)."""
    out = prefix
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out = f"{out or root}[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out or root


def _located(error: Mapping[str, Any]) -> tuple[Loc, str]:
    """Where one pydantic error is (relative) and hafo's wording of it."""
    loc: Loc = tuple(error["loc"])
    if error["type"] == "invalid_key":  # a non-string key: the mapping is at fault
        return loc[:-1], f"keys must be strings, got {loc[-1]!r}"
    return loc, _message(error)


def as_validation_error(exc: PydanticError, prefix: str, root: str) -> ValidationError:
    """pydantic's errors as hafo's ``ValidationError``: every error, once each, the first
    one first (unknown fields of a section come before its other errors). An error about a
    value that holds an error already reported (a list left too short once its bad item is
    dropped) is a consequence: left out."""
    found: list[FieldError] = []
    for error in exc.errors(include_url=False):
        loc, message = _located(error)
        item = FieldError(field_path(prefix, loc, root), message)
        inside = any(f.field.startswith((f"{item.field}.", f"{item.field}[")) for f in found)
        if item not in found and not inside:
            found.append(item)
    return ValidationError.of(found)


def _reraised(errors: list[InitErrorDetails], exc: PydanticError | None) -> NoReturn:
    """Raise ``errors`` and then those of ``exc``, as one pydantic error (kept in hafo's
    wording, so that nothing is lost in the merge)."""
    merged = list(errors)
    for error in exc.errors(include_url=False) if exc is not None else ():
        loc, message = _located(error)
        merged.append(InitErrorDetails(type=PydanticCustomError("hafo", message), loc=loc,
                                       input=error.get("input")))
    raise PydanticError.from_exception_data("hafo", merged)


# --- JSON Schema ---------------------------------------------------------------------------

class _JsonSchema(GenerateJsonSchema):
    """JSON Schema 2020-12 without per-field titles, with mapping keys as ``propertyNames``."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        out: JsonSchemaValue = {"type": "object"}
        keys = self.generate_inner(schema["keys_schema"]) if "keys_schema" in schema else {}
        keys = {k: v for k, v in keys.items() if k != "type"}  # JSON keys are strings
        if keys:
            out["propertyNames"] = keys
        if "values_schema" in schema:
            values = self.generate_inner(schema["values_schema"])
            if values:
                out["additionalProperties"] = values
        return out


def nullable(schema: JsonSchemaValue) -> JsonSchemaValue:
    """``schema`` or null (as JSON Schema 2020-12 says it)."""
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind) or (
            {"type": "null"} in schema.get("anyOf", ())):
        return schema
    outer: dict[str, Any] = {k: schema[k] for k in ("default", "description") if k in schema}
    inner: dict[str, Any] = {k: v for k, v in schema.items() if k not in outer}
    if isinstance(inner.get("type"), str) and set(inner) <= {"type", "minimum", "maximum",
                                                             "exclusiveMinimum", "minLength",
                                                             "pattern", "format"}:
        return {**inner, "type": [inner["type"], "null"], **outer}
    return {"anyOf": [inner, {"type": "null"}], **outer}


# --- field types -----------------------------------------------------------------------------

def integral(value: Any) -> Any:
    """``value`` as an int where it is a float with no fraction (JSON Schema's integers
    include 1.0), else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class _Integer:
    """Strict integers (no bools, no strings), but 1.0 is 1 (JSON Schema's integers include
    it). Put it after the bounds: ``Annotated[int, Field(ge=0), INTEGER]``."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        inner = handler(source)
        if inner.get("type") == "int":
            inner = {**inner, "strict": True}
        return core_schema.no_info_before_validator_function(integral, inner)


INTEGER = _Integer()


_PATTERN_MESSAGES: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Matches:
    """A string that matches ``pattern`` as a whole, else ``message`` and the value. The
    validator and the JSON Schema use the same regex, ``^(?:pattern)$``: keep it to what
    Rust's regex, Python's and ECMA's share (no lookaround, no backreference)."""

    pattern: str
    message: str

    def __post_init__(self) -> None:
        _PATTERN_MESSAGES[self.anchored] = self.message

    @property
    def anchored(self) -> str:
        """The whole-string regex."""
        return f"^(?:{self.pattern})$"

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        schema = handler(source)
        if schema.get("type") != "str":
            raise TypeError(f"Matches applies to strings, not {schema.get('type')}")
        return {**schema, "pattern": self.anchored}


@dataclasses.dataclass(frozen=True)
class Expect:
    """Say what the value must be (``must be WHAT, got ...``) when it has the wrong shape."""

    what: str
    _SHAPE: ClassVar[frozenset[str]] = frozenset({*_KINDS, "too_short", "string_too_short"})

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        def shaped(value: Any, validate: Callable[[Any], Any]) -> Any:
            try:
                return validate(value)
            except PydanticError as exc:
                first = exc.errors()[0]
                if first["loc"] == () and first["type"] in self._SHAPE:
                    raise PydanticCustomError(
                        "shape", f"must be {self.what}, got {_show(value)}") from None
                raise

        return core_schema.no_info_wrap_validator_function(shaped, handler(source))


class ScalarText:
    """A string, number or boolean, kept as text (``true``/``false`` for booleans), without
    NUL characters: environment values, labels, headers."""

    JSON: ClassVar[JsonSchemaValue] = {"oneOf": [
        {"type": "string", "pattern": "^[^\\x00]*$"}, {"type": "number"}, {"type": "boolean"}]}

    @staticmethod
    def _text(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, int | float) and math.isfinite(value):
            return str(value)
        if not isinstance(value, str):
            raise PydanticCustomError("scalar", f"must be a string or number, got {_show(value)}")
        if "\x00" in value:
            raise PydanticCustomError("scalar", "must not contain a NUL character")
        return value

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(cls._text)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return dict(cls.JSON)


class OneOrMore:
    """A non-empty list, or one item standing for a list of it (``expect_status: 200``):
    ``Annotated[tuple[Item, ...], Field(min_length=1), OneOrMore()]``."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        many = handler(source)  # a tuple schema: the item with its constraints, min_length
        item = many["items_schema"][0]
        one = SchemaValidator(core_schema.no_info_after_validator_function(lambda v: (v,), item))

        def either(value: Any, validate_many: Callable[[Any], Any]) -> Any:
            if isinstance(value, list | tuple):
                return validate_many(value)
            return one.validate_python(value)

        return core_schema.no_info_wrap_validator_function(either, many)

    def __get_pydantic_json_schema__(self, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        many = handler(schema)
        return {"anyOf": [many["items"], many]}


@dataclasses.dataclass(frozen=True)
class JsonOf:
    """The annotated value is the JSON form of ``kind`` (a record's ``to_dict()``): it is
    described, and would be validated, as that type."""

    kind: Any

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        return handler.generate_schema(self.kind)


# --- declarations ----------------------------------------------------------------------------

_NAMES: dict[type, dict[str, str]] = {}


def _json_names(cls: type) -> dict[str, str]:
    """JSON key -> attribute, for the fields of dataclass ``cls`` (made once per class)."""
    names = _NAMES.get(cls)
    if names is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        names = {}
        for f in dataclasses.fields(cls):
            aliases = [m.alias for m in getattr(hints.get(f.name), "__metadata__", ())
                       if isinstance(m, FieldInfo) and m.alias]
            names[aliases[0] if aliases else f.name] = f.name
        _NAMES[cls] = names
    return names


class OmitDefault:
    """Marks a field that the JSON form leaves out while it has its default value."""


OMIT_DEFAULT = OmitDefault()


class Section:
    """Mixin for a dataclass that people write (see the module docstring).

    ``_check`` runs once the fields are valid; it reports with ``invalid(field, message)``.
    """

    __slots__ = ()  # a slotted dataclass stays without a __dict__
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    def _check(self) -> None:
        """Rules between fields (none by default)."""

    @classmethod
    def _prepare(cls, raw: Any, names: Mapping[str, str], forbid: bool,
                 unknown: list[InitErrorDetails]) -> Any:
        """A mapping with string keys and known keys (``names``, unless not ``forbid``);
        null values dropped (= not given). Each unknown key is added to ``unknown`` (with
        the closest known name) and left out, so that the other fields are checked too."""
        if type(raw) is not dict:
            if isinstance(raw, cls):
                return raw
            if not isinstance(raw, Mapping):
                invalid((), f"must be a mapping, got {_show(raw)}", raw)
            raw = dict(raw)
        nulls = False
        strange = []
        for key, value in raw.items():
            if key not in names:
                if not isinstance(key, str):
                    invalid((), f"keys must be strings, got {key!r}", raw)
                if forbid:
                    hint = did_you_mean(key, names)
                    unknown.append(InitErrorDetails(type=PydanticCustomError(
                        "hafo", f"unknown field{', ' + hint if hint else ''} "
                        f"(allowed: {', '.join(sorted(names))})"), loc=(key,), input=value))
                    strange.append(key)
            nulls = nulls or value is None
        if strange or nulls:
            return {k: v for k, v in raw.items() if v is not None and k not in strange}
        return raw

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        inner = handler(source)
        omitted = _omitted(cls)

        def dump(value: Any, serialize: Callable[[Any], Any]) -> Any:
            data = serialize(value)
            for name, default in omitted:
                if getattr(value, name) == default:
                    data.pop(name, None)
            return data

        serialization = (core_schema.wrap_serializer_function_ser_schema(dump)
                         if omitted else None)
        names, forbid = _json_names(cls), cls.__pydantic_config__.get("extra") == "forbid"

        def prepare(raw: Any, validate: Callable[[Any], Any]) -> Any:
            unknown: list[InitErrorDetails] = []
            known = cls._prepare(raw, names, forbid, unknown)
            try:
                value = validate(known)
            except PydanticError as exc:
                if unknown:
                    _reraised(unknown, exc)
                raise
            if unknown:
                _reraised(unknown, None)
            return value

        prepared = core_schema.no_info_wrap_validator_function(prepare, inner)
        if cls._check is Section._check:  # no rules between fields: nothing to call after
            return {**prepared, "serialization": serialization} if serialization else prepared

        def checked(value: Any) -> Any:
            value._check()
            return value

        return core_schema.no_info_after_validator_function(checked, prepared,
                                                            serialization=serialization)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        out = handler(schema)
        target = handler.resolve_ref_schema(out)
        required = set(target.get("required", ()))
        properties = target.get("properties", {})
        for key, prop in properties.items():
            if key not in required:
                properties[key] = nullable(prop)
        return out


def _omitted(cls: type) -> list[tuple[str, Any]]:
    """(attribute, default) of the fields marked ``OMIT_DEFAULT``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        if any(m is OMIT_DEFAULT for m in getattr(hints.get(f.name), "__metadata__", ())):
            factory: Callable[[], Any] = f.default_factory  # type: ignore[assignment]
            default = f.default if f.default is not dataclasses.MISSING else factory()
            out.append((f.name, default))
    return out


class Record:
    """Mixin for a dataclass that hafo writes to etcd (see the module docstring)."""

    __slots__ = ()  # records are slotted dataclasses: small, with fast attribute access
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="ignore")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the class for what the fields mean)."""
        data: dict[str, Any] = schema_of(type(self)).dump(self)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Inverse of ``to_dict``; ValidationError names the field."""
        return schema_of(cls).validate(data)


class Schema(Generic[T]):
    """Validation, JSON form and JSON Schema of one declared type.

    ``root`` names the value itself in errors (``spec``, ``config``); ``prefix`` (default
    ``root``) is put before the path of every other error (``""`` for none)."""

    def __init__(self, kind: Any, root: str, prefix: str | None = None) -> None:
        self.adapter: TypeAdapter[T] = TypeAdapter(kind)
        self.validator: SchemaValidator = self.adapter.validator  # type: ignore[assignment]
        self.serializer = self.adapter.serializer
        self.root = root
        self.prefix = root if prefix is None else prefix

    def validate(self, raw: Any, prefix: str | None = None,
                 context: dict[str, Any] | None = None) -> T:
        """``raw`` as the declared type, or ValidationError naming the first bad field."""
        try:
            return self.validator.validate_python(  # type: ignore[no-any-return]
                raw, context=context)
        except PydanticError as exc:
            where = self.prefix if prefix is None else prefix
            raise as_validation_error(exc, where, where or self.root) from None

    def validate_json(self, data: bytes | str, context: dict[str, Any] | None = None) -> T:
        """JSON text straight into the declared type (no intermediate dicts)."""
        try:
            return self.validator.validate_json(  # type: ignore[no-any-return]
                data, context=context)
        except PydanticError as exc:
            raise as_validation_error(exc, self.prefix, self.root) from None

    def dump(self, value: T) -> Any:
        """The JSON form of ``value`` (plain dicts, lists, strings and numbers)."""
        return self.serializer.to_python(value, mode="json")

    def json_schema(self) -> dict[str, Any]:
        """Its JSON Schema (2020-12), for input (``validation``) with ``$defs``."""
        return self.adapter.json_schema(schema_generator=_JsonSchema)

    def fields(self) -> set[str]:
        """The dotted path of every key the format names (``timing.heartbeat``), not into
        lists or free-form mappings (for the documentation's tests)."""
        root = self.json_schema()
        defs = root.get("$defs", {})
        out: set[str] = set()

        def walk(node: Any, path: str) -> None:
            if not isinstance(node, dict):
                return
            if "$ref" in node:
                walk(defs[node["$ref"].rsplit("/", 1)[-1]], path)
            for combined in ("anyOf", "oneOf", "allOf"):
                for branch in node.get(combined, ()):
                    walk(branch, path)
            for key, value in node.get("properties", {}).items():
                out.add(f"{path}.{key}" if path else key)
                walk(value, f"{path}.{key}" if path else key)

        walk(root, "")
        return out


def json_schemas(schemas: Mapping[str, tuple[Schema[Any], str]],
                 ref_template: str) -> dict[str, Any]:
    """Named JSON Schemas of several declarations sharing one set of definitions:
    ``{name: (schema, "validation" | "serialization")}`` -> every definition by its type's
    name, and each ``name`` (a reference to its type's definition when the names differ)."""
    keyed, defs = TypeAdapter.json_schemas(
        [(name, mode, schema.adapter)  # type: ignore[misc]
         for name, (schema, mode) in schemas.items()],
        ref_template=ref_template, schema_generator=_JsonSchema)
    out: dict[str, Any] = dict(defs.get("$defs", {}))
    for (name, _mode), value in keyed.items():
        out.setdefault(name, value)  # a type named ``name`` is its own definition
    prefix = ref_template.split("{model}")[0]
    kept: set[str] = set()
    todo = [name for name, _mode in keyed]
    while todo:  # only the definitions reachable from the named schemas
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += re.findall(re.escape(prefix) + r"([\w-]+)", json.dumps(out[name]))
    return {name: value for name, value in out.items() if name in kept}


_SCHEMAS: dict[type, Schema[Any]] = {}


def schema_of(cls: type[T]) -> Schema[T]:
    """The schema of a ``Record`` class, made once."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        schema = _SCHEMAS[cls] = Schema(cls, cls.__name__.lower())
    return schema


# --- field types shared by the formats ------------------------------------------------------

#: A non-empty string.
Text = Annotated[str, Strict(), Field(min_length=1)]
#: A finite number, never a boolean.
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Positive = Annotated[Number, Field(gt=0)]
NonNegative = Annotated[Number, Field(ge=0)]
#: true or false (not 1, not "yes").
Flag = Annotated[bool, Strict()]
#: One argument of a command.
Arg = Annotated[str, Strict(), Matches(r"[^\x00]+", "must be a non-empty string without NUL "
                                                   "characters")]
#: A command as an argv list (never a shell string).
Argv = Annotated[tuple[Arg, ...], Field(min_length=1),
                 Expect("a non-empty list of strings (argv, no shell)")]
#: Environment variables, labels, selectors, headers: name -> text.
StrMap = Mapping[Annotated[str, Strict(), Matches(r"[^=\x00]+", "keys must be non-empty "
                                                  "strings without '=' or NUL")],
                 Annotated[str, ScalarText()]]
WorkloadName = Annotated[str, Strict(), Matches(WORKLOAD_NAME, "must be lowercase letters, "
                                                "digits and '-', 1-52 characters")]
NodeName = Annotated[str, Strict(), Matches(NODE_NAME_RE.pattern, "must be letters, digits, "
                                            "'.', '_' or '-' (at most 63, not starting with "
                                            "'.')")]
MigProfile = Annotated[str, Strict(), Matches(MIG_PROFILE, "must be a MIG profile like 1g.10gb")]
