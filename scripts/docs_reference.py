"""The reference pages of the documentation site, generated from the code.

``docs/hooks/reference.py`` adds each page to the MkDocs build (``reference/config.md`` ...),
so the reference is never written twice: a field added to a model appears with no other
edit, and one without a description fails the build (``UndocumentedError``, naming every
such field as ``Class.field``).

One function per page, each returning Markdown: ``config_page()``, ``spec_page()``,
``cli_page()``, ``api_page()``, ``metrics_page()``, ``events_page()`` (``PAGES`` maps each
page's path under ``docs/`` to its function). Descriptions come from the code:

- a field of a dataclass (stdlib or pydantic): its *attribute docstring*, the string
  statement right after the field's annotated assignment in the class body, read with
  ``ast`` from the class's source (nothing changes at runtime);
- an enum member: the string statement right after its assignment, likewise;
- a CLI argument: its argparse ``help``; a metric: its help text; an HTTP operation: the
  ``summary`` of the OpenAPI document the daemon serves.

Types, defaults and constraints come from the JSON Schema that validates the format
(``hafo.model.schema.Schema``), so the page says what the validator accepts.

Run as a script to print one page: ``python scripts/docs_reference.py config``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import dataclasses
import enum
import inspect
import itertools
import json
import re
import sys
import tempfile
import textwrap
import threading
import typing
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: hafo from this checkout
    sys.path.insert(0, str(ROOT))

T = TypeVar("T")

__all__ = ["PAGES", "FieldDoc", "UndocumentedError", "api_page", "attribute_docs", "cli_page",
           "config_page", "enum_reference", "enum_rows", "events_page", "field_docs",
           "fields_reference", "fields_table", "metrics_page", "spec_page"]


class UndocumentedError(Exception):
    """Fields, members, arguments or metrics without a description: all of them, sorted."""

    def __init__(self, missing: Iterable[str], page: str = "") -> None:
        self.missing = sorted(set(missing))
        where = f" ({page})" if page else ""
        super().__init__(
            f"undocumented{where}: {', '.join(self.missing)}. Add a docstring (a string "
            "statement right under the field or member; argparse help for an argument; help "
            "text for a metric): the reference pages are generated from it")


class _Missing:
    """Collects what a page lacks; ``check()`` raises them all at once."""

    def __init__(self, page: str) -> None:
        self.page = page
        self.names: list[str] = []

    def add(self, name: str) -> None:
        self.names.append(name)

    def check(self) -> None:
        if self.names:
            raise UndocumentedError(self.names, self.page)


# --- Markdown ---------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)


def escape(text: str, pipes: bool = False) -> str:
    """``text`` (Markdown) on one line, with what would turn into markup escaped outside
    its code spans: ``<`` (an HTML tag), ``*`` (emphasis) and, with ``pipes``, ``|`` (a cell
    separator in a table; inside code spans Python-Markdown's tables keep it)."""
    flat = " ".join(str(text).split())

    def plain(part: str) -> str:
        part = part.replace("<", "&lt;").replace("*", "\\*")
        return part.replace("|", "\\|") if pipes else part

    out, last = [], 0
    for match in _CODE_SPAN.finditer(flat):
        out.append(plain(flat[last:match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(plain(flat[last:]))
    return "".join(out)


def cell(text: str) -> str:
    """``text`` as one table cell (``escape`` with ``|`` too)."""
    return escape(text, pipes=True)


def code(value: Any) -> str:
    """``value`` as a code span (longer fences around backticks)."""
    text = value if isinstance(value, str) else json.dumps(value)
    if not text:
        return '`""`'
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table (every cell escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading of this Markdown text."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"`+([^`]*)`+", r"\1", heading)
    return str(slugify(text, "-"))


def _header(title: str, sources: str) -> list[str]:
    return [f"# {title}", "",
            f"Generated from the code ({sources}) by `scripts/docs_reference.py` at every "
            "build of this site: do not edit this page, edit the code.", ""]


def _text(doc: str | None) -> str:
    """A docstring as one paragraph."""
    return " ".join((doc or "").split())


def _first_paragraph(doc: str | None) -> str:
    return escape((doc or "").strip().split("\n\n")[0])


# --- attribute docstrings ---------------------------------------------------------------------

_DOCS: dict[type, dict[str, str]] = {}


def attribute_docs(cls: type) -> dict[str, str]:
    """name -> docstring of each attribute that ``cls``'s own body declares with a string
    statement right after it (``x: int = 0`` then ``\"\"\"What x is.\"\"\"``), read from
    its source. A class without source has none."""
    found = _DOCS.get(cls)
    if found is not None:
        return found
    found = {}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        tree = None
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), []) \
        if tree is not None else []
    for statement, after in itertools.pairwise(body):
        name = None
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            name = statement.target.id
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            name = statement.targets[0].id
        if name is not None and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            found[name] = inspect.cleandoc(after.value.value)
    _DOCS[cls] = found
    return found


def _declaring(cls: type, attribute: str) -> type:
    """The class of ``cls``'s MRO whose body declares ``attribute``."""
    for klass in cls.__mro__:
        if attribute in inspect.get_annotations(klass):
            return klass
    return cls


def _comment_doc(module: Any, name: str) -> str:
    """The ``#:`` comment lines right above ``name = ...`` in ``module``'s source."""
    lines = inspect.getsource(module).splitlines()
    for number, line in enumerate(lines):
        if re.match(rf"{re.escape(name)}\s*(:[^=]*)?=", line):
            comment: list[str] = []
            while number > 0 and lines[number - 1].startswith("#:"):
                number -= 1
                comment.insert(0, lines[number][2:].strip())
            return " ".join(comment)
    return ""


# --- JSON Schema as words ----------------------------------------------------------------------

class _Words:
    """Types and constraints of a JSON Schema in words; ``$ref``s are looked up in ``defs``
    (inlined), or, with ``link``, written as ``link(name)``. ``nulls``: say where null is
    allowed (in what a section accepts, null is the same as leaving the key out: not said)."""

    def __init__(self, defs: Mapping[str, Any], link: Callable[[str], str] | None = None,
                 nulls: bool = False) -> None:
        self.defs = defs
        self.link = link
        self.nulls = nulls

    def deref(self, schema: Any) -> dict[str, Any]:
        while isinstance(schema, dict) and "$ref" in schema:
            schema = {**self.defs[schema["$ref"].rsplit("/", 1)[-1]],
                      **{k: v for k, v in schema.items() if k != "$ref"}}
        return schema if isinstance(schema, dict) else {}

    @staticmethod
    def _null(schema: Any) -> bool:
        return isinstance(schema, dict) and schema.get("type") == "null"

    @staticmethod
    def _join(parts: Sequence[str]) -> str:
        unique = list(dict.fromkeys(p for p in parts if p))
        if len(unique) <= 1:
            return "".join(unique)
        return ", ".join(unique[:-1]) + " or " + unique[-1]

    def branches(self, schema: Mapping[str, Any]) -> list[Any]:
        """The non-null alternatives of an ``anyOf``/``oneOf`` schema (none: [])."""
        return [b for key in ("anyOf", "oneOf") for b in schema.get(key, ())
                if not self._null(b)]

    def type(self, schema: Any) -> str:
        """What kind of value: ``integer``, ``list of string``, ``mapping of string to
        number``, ```auto`, `none` or mapping``..."""
        return self._join(self._alternatives(schema))

    def _alternatives(self, schema: Any) -> list[str]:
        if isinstance(schema, dict) and "$ref" in schema and self.link is not None:
            return [self.link(schema["$ref"].rsplit("/", 1)[-1])]
        schema = self.deref(schema)
        branches = [b for key in ("anyOf", "oneOf") for b in schema.get(key, ())]
        if branches:
            kept = [b for b in branches if self.nulls or not self._null(b)]
            return [a for b in kept for a in self._alternatives(b)]
        if "const" in schema:
            return [code(schema["const"])]
        if "enum" in schema:
            return [code(v) for v in schema["enum"]]
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if self.nulls or k != "null"]
            if len(kinds) != 1:
                return kinds
            kind = kinds[0]
        if kind == "array":
            if "prefixItems" in schema:
                return ["list of " + ", ".join(self.type(i) for i in schema["prefixItems"])]
            return [f"list of {self.type(schema['items'])}" if "items" in schema else "list"]
        if kind == "object" or "properties" in schema or "additionalProperties" in schema:
            values = schema.get("additionalProperties")
            if "properties" not in schema and isinstance(values, dict) and values:
                keys = self._key_type(schema.get("propertyNames", {}))
                return [f"mapping of {keys} to {self.type(values)}"]
            return ["mapping"]
        if kind is None and ({"minimum", "maximum", "exclusiveMinimum"} & schema.keys()):
            return ["number"]
        return [str(kind) if kind else "any"]

    def _key_type(self, names: Mapping[str, Any]) -> str:
        if {"minimum", "maximum"} & names.keys():
            return "integer"
        return "string"

    def _bounds(self, schema: Mapping[str, Any]) -> str:
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            return f"{_number(low)} to {_number(high)}"
        parts = []
        if low is not None:
            parts.append(f">= {_number(low)}")
        if "exclusiveMinimum" in schema:
            parts.append(f"> {_number(schema['exclusiveMinimum'])}")
        if high is not None:
            parts.append(f"<= {_number(high)}")
        if "exclusiveMaximum" in schema:
            parts.append(f"< {_number(schema['exclusiveMaximum'])}")
        return ", ".join(parts)

    def _count(self, schema: Mapping[str, Any], low_key: str, high_key: str,
               unit: str) -> str:
        low, high = schema.get(low_key), schema.get(high_key)
        if low is not None and high is not None:
            return f"{low} to {high} {unit}s"
        if low == 1 and unit == "character":
            return "non-empty"
        if low is not None:
            return f"at least {low} {unit}{'s' if low != 1 else ''}"
        if high is not None:
            return f"at most {high} {unit}s"
        return ""

    def rules(self, schema: Any, where: str = "") -> list[str]:
        """Every constraint, outermost first; those of list items, mapping keys and values
        prefixed with where they apply (``each``, ``keys``, ``values``)."""
        if isinstance(schema, dict) and "$ref" in schema and self.link is not None:
            return []
        schema = self.deref(schema)
        out: list[str] = []
        for branch in self.branches(schema):
            out += self.rules(branch, where)
        found = [self._bounds(schema)]
        found.append(self._count(schema, "minLength", "maxLength", "character"))
        found.append(self._count(schema, "minItems", "maxItems", "item"))
        if "pattern" in schema:
            from hafo.model.schema import _PATTERN_MESSAGES

            message = _PATTERN_MESSAGES.get(schema["pattern"])
            found.append(f"{message} ({code(schema['pattern'])})" if message
                         else f"matches {code(schema['pattern'])}")
        if isinstance(schema.get("not"), dict) and "enum" in schema["not"]:
            found.append("not " + self._join([code(v) for v in schema["not"]["enum"]]))
        label = where.rsplit(", ", 1)[-1]
        out += [rule if not where or rule.startswith(label) else f"{where}: {rule}"
                for rule in found if rule]
        inner = f"{where}, " if where else ""
        if isinstance(schema.get("items"), dict):
            out += self.rules(schema["items"], f"{inner}each")
        if isinstance(schema.get("propertyNames"), dict):
            out += self.rules(schema["propertyNames"], f"{inner}keys")
        if isinstance(schema.get("additionalProperties"), dict):
            out += self.rules(schema["additionalProperties"], f"{inner}values")
        return list(dict.fromkeys(out))

    def objects(self, schema: Any) -> Iterator[dict[str, Any]]:
        """The object schemas with ``properties`` that ``schema`` is (or may be)."""
        schema = self.deref(schema)
        if "properties" in schema:
            yield schema
        for key in ("anyOf", "oneOf", "allOf"):
            for branch in schema.get(key, ()):
                yield from self.objects(branch)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 100000 else str(value)


def _default(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return code("true" if value else "false")
    if isinstance(value, enum.Enum):
        value = value.value
    if dataclasses.is_dataclass(value):
        return "its fields' defaults"
    if isinstance(value, int | float):
        return code(_number(value).replace(",", ""))
    if isinstance(value, str):
        return code(value)
    text = json.dumps(value, separators=(", ", ": "))
    return code(text) if len(text) <= 48 else "its fields' defaults"


# --- the fields of a declaration -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One documented key of a format: its dotted path, where it is declared
    (``Class.attribute``), its type, default, constraints and description (None: none)."""

    path: str
    owner: str
    type: str
    default: str
    rules: str
    description: str | None


def _types_in(hint: Any) -> Iterator[type]:
    """The classes a type annotation names (through Annotated, unions, generics)."""
    if isinstance(hint, type):
        yield hint
    for arg in typing.get_args(hint):
        yield from _types_in(arg)


def _class_index(root: type) -> dict[str, type]:
    """Name -> class, for every dataclass ``root`` reaches through its fields' annotations
    and every dataclass defined in the modules of those (a validator may use one that no
    annotation names, as ``node.gpus`` does ``Simulation``): the JSON Schema's titles."""
    found: dict[str, type] = {}
    todo = [root]
    modules: set[str] = set()
    while todo:
        cls = todo.pop(0)
        if cls.__name__ in found or not dataclasses.is_dataclass(cls):
            continue
        found[cls.__name__] = cls
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except Exception:  # a local class whose annotations cannot be resolved: none
            hints = {}
        todo += [t for hint in hints.values() for t in _types_in(hint)]
        if cls.__module__ not in modules:
            modules.add(cls.__module__)
            module = sys.modules.get(cls.__module__)
            todo += [v for v in vars(module).values()
                     if isinstance(v, type) and v.__module__ == cls.__module__] \
                if module is not None else []
    return found


def _attribute_of(cls: type, key: str) -> str:
    """The attribute of dataclass ``cls`` that JSON key ``key`` sets (an alias's field)."""
    from pydantic.fields import FieldInfo

    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:
        return key
    for name, hint in hints.items():
        for meta in getattr(hint, "__metadata__", ()):
            if isinstance(meta, FieldInfo) and meta.alias == key:
                return name
    return key


def _dataclass_default(cls: type, attribute: str) -> Any:
    for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
        if f.name == attribute:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return dataclasses.MISSING


def field_docs(cls: type, prefix: str = "", skip: Sequence[type] = ()) -> list[FieldDoc]:
    """Every key of the format that dataclass ``cls`` declares (as ``Schema(cls).fields()``
    walks it: into sections, not into lists or free-form mappings), depth first in
    declaration order, each with its attribute docstring. ``skip``: leave out the fields
    these classes declare (documented elsewhere)."""
    from hafo.model.schema import Schema

    root = Schema(cls, "value").json_schema()
    words = _Words(root.get("$defs", {}))
    classes = _class_index(cls)
    out: list[FieldDoc] = []

    def walk(node: Mapping[str, Any], path: str, owner_cls: type | None) -> None:
        required = set(node.get("required", ()))
        for key, prop in node.get("properties", {}).items():
            here = f"{path}.{key}" if path else key
            if owner_cls is not None:
                attribute = _attribute_of(owner_cls, key)
                declaring = _declaring(owner_cls, attribute)
                if declaring in skip:
                    continue
                owner = f"{declaring.__name__}.{attribute}"
                description = attribute_docs(declaring).get(attribute)
                python_default = _dataclass_default(owner_cls, attribute)
            else:
                owner, description, python_default = here, None, dataclasses.MISSING
            schema = words.deref(prop)
            if key in required:
                default = "required"
            elif "default" in prop:
                default = _default(prop["default"])
            elif python_default is not dataclasses.MISSING:
                default = _default(python_default)
            else:
                default = ""
            out.append(FieldDoc(here, owner, words.type(prop), default,
                                "; ".join(words.rules(prop)), description))
            for inner in words.objects(schema):
                walk(inner, here, classes.get(str(inner.get("title"))))

    walk(root, prefix, cls)
    return out


def fields_table(docs: Sequence[FieldDoc], missing: _Missing | None = None,
                 flag: Mapping[str, str] | None = None) -> str:
    """A Markdown table of ``docs``: field, type, default, constraints, description (with
    ``flag``: the CLI flag that sets each field, after the field). A field without a
    description is added to ``missing``."""
    rows = []
    for doc in docs:
        if not doc.description and missing is not None:
            missing.add(doc.owner)
        row = [code(doc.path)]
        if flag is not None:
            row.append(flag.get(doc.path, ""))
        row += [doc.type, doc.default, doc.rules, _text(doc.description)]
        rows.append(row)
    header = ["field", *(["flag"] if flag is not None else []), "type", "default",
              "constraints", "description"]
    return table(header, rows)


def fields_reference(cls: type, prefix: str = "") -> str:
    """The table of the fields of dataclass ``cls`` alone (``field_docs``, ``fields_table``);
    ``UndocumentedError`` names every field without a docstring."""
    missing = _Missing(cls.__name__)
    text = fields_table(field_docs(cls, prefix), missing)
    missing.check()
    return text


def enum_reference(cls: type[enum.Enum]) -> str:
    """The table of the members of ``cls``; ``UndocumentedError`` names every member
    without a docstring."""
    missing = _Missing(cls.__name__)
    text = table(["value", "meaning"], enum_rows(cls, missing))
    missing.check()
    return text


def enum_rows(cls: type[enum.Enum], missing: _Missing | None = None) -> list[list[str]]:
    """[value, description] of each member of ``cls``, in declaration order; a member
    without a docstring is added to ``missing`` (as ``Class.MEMBER``)."""
    docs = attribute_docs(cls)
    rows = []
    for name, member in cls.__members__.items():
        description = docs.get(name)
        if not description and missing is not None:
            missing.add(f"{cls.__name__}.{name}")
        rows.append([code(str(member.value)), _text(description)])
    return rows


# --- pages ----------------------------------------------------------------------------------

def config_page(root: type | None = None) -> str:
    """The daemon config file: every field of ``hafo.model.config.Config`` (or of the
    dataclass ``root``), a table per top-level key."""
    if root is None:
        from hafo.model.config import Config

        root = Config
    missing = _Missing("reference/config.md")
    docs = field_docs(root)
    groups: dict[str, list[FieldDoc]] = {}
    for doc in docs:
        groups.setdefault(doc.path.split(".")[0], []).append(doc)
    out = _header("Config file", "`hafo/model/config.py`, `hafo/model/health_config.py`")
    out += [
        "One YAML file per daemon (`hafo agent --config FILE`, `hafo controller --config "
        "FILE`). Unknown fields are refused, and every error names the field "
        "(`etcd.ca: is required with https:// endpoints`); an optional field set to `null` "
        "takes its default. Times are in seconds. `node` is read by the agent only (the "
        "others ignore it); the description of a field says when only one daemon uses it.",
        "",
        f"{len(docs)} fields, by top-level key: "
        + ", ".join(f"[`{key}`](#{slug(key)})" for key in groups) + ".",
        ""]
    for top, group in groups.items():
        out += [f"## `{top}`", "", fields_table(group, missing), ""]
    missing.check()
    return "\n".join(out).rstrip() + "\n"


def spec_page() -> str:
    """The workload spec (``WorkloadSpec``), its checks and the queue declaration
    (``QueueSpec``)."""
    from hafo.model.checks import BUILTIN_CHECKS, CheckTiming, PluginCheckSpec
    from hafo.model.queues import QueueSpec
    from hafo.model.spec import MAX_SPEC_BYTES, WorkloadSpec

    missing = _Missing("reference/spec.md")
    out = _header("Workload spec and queues",
                  "`hafo/model/spec.py`, `hafo/model/checks.py`, `hafo/model/queues.py`")
    out += ["## Workload spec", "",
            _first_paragraph(WorkloadSpec.__doc__), "",
            "YAML for `hafo submit`, or the same as JSON for `POST /v1/workloads`. Unknown "
            "fields are refused, and every error names its field (`spec.restart.window`); "
            "an optional field set to `null` takes its default. A spec is at most "
            f"{MAX_SPEC_BYTES // 1024} KiB encoded as JSON.", "",
            fields_table(field_docs(WorkloadSpec), missing), ""]
    out += ["## Checks", "",
            "Each item of `checks` is one mapping: its `type`, the timing every check has, "
            "and the options of its type. Unknown options of a built-in type are refused.",
            "", "### Every check", "",
            fields_table(field_docs(CheckTiming, prefix="checks[]"), missing), ""]
    forms: list[tuple[str, type]] = [*BUILTIN_CHECKS.items(), ("plugin", PluginCheckSpec)]
    for name, form in forms:
        title = f"### `{name}`" if name != "plugin" else "### A plugin's type"
        out += [title, "", _first_paragraph(form.__doc__), "",
                fields_table(field_docs(form, prefix="checks[]", skip=(CheckTiming,)),
                             missing), ""]
    out += ["## Queue declaration", "",
            _first_paragraph(QueueSpec.__doc__), "",
            "The JSON body of `PUT /v1/queues/{name}` (where `name` may be left out), and "
            "what `hafo queue set` writes from its flags.", "",
            fields_table(field_docs(QueueSpec), missing, flag=_queue_flags()), ""]
    missing.check()
    return "\n".join(out).rstrip() + "\n"


def _queue_flags() -> dict[str, str]:
    """Queue field -> the ``hafo queue set`` argument that sets it (by its ``dest``)."""
    from hafo.cli import build_parser
    from hafo.model.queues import QueueSpec

    commands = dict(_commands(build_parser()))
    parser = commands.get("hafo queue set")
    if parser is None:
        return {}
    fields = {f.name for f in dataclasses.fields(QueueSpec)}
    out = {}
    formatter = parser._get_formatter()
    for action in parser._actions:
        metavar = action.metavar.lower() if isinstance(action.metavar, str) else ""
        for name in (action.dest, f"{action.dest}s", metavar):
            if name in fields and name not in out:
                out[name] = code(formatter._format_action_invocation(action)) \
                    if action.option_strings else code(action.metavar or action.dest.upper())
    return out


# --- CLI ---------------------------------------------------------------------------------------

def _commands(parser: argparse.ArgumentParser,
              prefix: str = "hafo") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(full command, parser) of ``parser`` and every sub-command under it, depth first."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prefix} {name}")


def _command_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Sub-command name -> its ``help`` in ``parser``."""
    out: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                out[choice.dest] = choice.help or ""
    return out


def _arguments(command: str, parser: argparse.ArgumentParser,
               missing: _Missing) -> list[list[str]]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) \
                or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            name = formatter._format_action_invocation(action)
        else:
            name = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        text = formatter._expand_help(action) if action.help else ""
        if not text:
            missing.add(f"{command} {name}")
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or (
            not action.option_strings and action.nargs is None) else _default(default)
        if action.required:
            shown = "required"
        elif not action.option_strings and action.nargs in ("?", "*"):
            shown = shown or "optional"
        choices = ", ".join(code(str(c)) for c in action.choices) if action.choices else ""
        if isinstance(action, argparse._AppendAction):
            text += " (repeatable)"
        rows.append([code(name), text, shown, choices])
    return rows


def _exit_codes(parser: argparse.ArgumentParser, missing: _Missing) -> list[list[str]]:
    """[code, constant, meaning]: the codes ``hafo --help`` lists, ``hafo.exits``' constants
    and ``hafo.cli``'s own."""
    import hafo.cli as cli
    import hafo.exits as exits

    said = dict(re.findall(r"(\d+) ([^,]+)",
                           (parser.epilog or "").partition("exit codes:")[2]))
    names: dict[str, str] = {}
    for module in (exits, cli):
        for name, value in vars(module).items():
            if name.startswith("EXIT_") and isinstance(value, int):
                names.setdefault(str(value), f"{module.__name__}.{name}")
    rows = []
    for number in sorted({*said, *names}, key=int):
        meaning = said.get(number, "")
        if not meaning and number in names:
            module_name, _, constant = names[number].rpartition(".")
            meaning = _comment_doc(sys.modules[module_name], constant)
        if not meaning:
            missing.add(f"exit code {number} ({names.get(number, 'hafo --help')})")
        rows.append([code(number), code(names[number]) if number in names else "",
                     meaning])
    return rows


def cli_page() -> str:
    """Every ``hafo`` command and sub-command with its arguments, and the exit codes."""
    from hafo.cli import build_parser

    parser = build_parser()
    missing = _Missing("reference/cli.md")
    commands = list(_commands(parser))
    helps: dict[str, str] = {}
    for name, sub in commands:
        for child, text in _command_help(sub).items():
            helps[f"{name} {child}"] = text
    out = _header("Command line", "`hafo/cli.py`, `hafo/commands/`")
    out += [escape(parser.description or ""), "",
            "`hafo COMMAND --help` prints the same. Every argument below is as argparse "
            "declares it.", "",
            table(["command", "does"],
                  [[f"[{code(name)}](#{slug(name)})", helps.get(name, "")]
                   for name, _sub in commands[1:]]), ""]
    for name, sub in commands:
        depth = name.count(" ")
        if depth and not helps.get(name):
            missing.add(f"{name} (the command's help)")
        out += [f"{'#' * min(depth + 1, 4)} `{name}`" if depth else "## `hafo`", ""]
        about = sub.description or helps.get(name, "")
        if about:
            out += [escape(about), ""]
        rows = _arguments(name, sub, missing)
        subs = _command_help(sub)
        if subs and depth:
            out += ["Sub-commands: " + ", ".join(f"[{code(f'{name} {child}')}]"
                                                 f"(#{slug(f'{name} {child}')})"
                                                 for child in subs) + ".", ""]
        if rows:
            out += [table(["argument", "description", "default", "choices"], rows), ""]
        for group in sub._mutually_exclusive_groups:
            options = [code(a.option_strings[-1] if a.option_strings else a.dest.upper())
                       for a in group._group_actions]
            out += [f"{'One' if group.required else 'At most one'} of "
                    f"{_Words._join(options)}.", ""]
    out += ["## Exit codes", "",
            "What `hafo` exits with (its `--help` epilog, the constants of `hafo/exits.py` "
            "and `hafo/cli.py`). Errors are one line on stderr, never a traceback.", "",
            table(["code", "constant", "meaning"], _exit_codes(parser, missing)), ""]
    missing.check()
    return "\n".join(out).rstrip() + "\n"


# --- HTTP API -----------------------------------------------------------------------------------

#: Components documented field by field on the spec page.
_SPEC_LINKS = {"WorkloadSpec": "spec.md#workload-spec", "QueueSpec": "spec.md#queue-declaration",
               "QueueBody": "spec.md#queue-declaration"}


def _component_anchor(name: str) -> str:
    return slug(f"Schema {name}")


def _operations(document: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path, operation), sorted by path then method."""
    out = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in ("get", "put", "post", "delete", "patch", "head", "options"):
                out.append((method.upper(), path, operation))
    return sorted(out, key=lambda o: (o[1], o[0]))


def _api_section(role: str, document: Mapping[str, Any], words: _Words,
                 missing: _Missing) -> list[str]:
    operations = _operations(document)
    schemes = document.get("components", {}).get("securitySchemes", {})
    info = document["info"]
    out = [f"## {role.capitalize()} API", "",
           f"{escape(info.get('title', ''))}, version {info.get('version')} "
           f"(`GET /openapi.json` of the {role}).", "",
           table(["route", "summary", "auth"],
                 [[f"[{code(f'{m} {p}')}](#{slug(f'{role} {m} {p}')})",
                   _text(op.get("summary")), _auth(op, schemes)]
                  for m, p, op in operations]), ""]
    for method, path, operation in operations:
        if not _text(operation.get("summary")):
            missing.add(f"{role} {method} {path} (its summary)")
        out += [f"### {role.capitalize()} `{method} {path}`", "",
                escape(operation.get("summary", "")), "",
                f"Auth: {_auth(operation, schemes)}.", ""]
        parameters = operation.get("parameters", [])
        if parameters:
            out += ["Parameters:", "",
                    table(["name", "in", "type", "required", "constraints", "description"],
                          [[code(p["name"]), p["in"], words.type(p.get("schema", {})),
                            "yes" if p.get("required") else "no",
                            "; ".join([*words.rules(p.get("schema", {})),
                                       *([f"default {_default(p['schema']['default'])}"]
                                         if "default" in p.get("schema", {}) else [])]),
                            _text(p.get("description"))]
                           for p in parameters]), ""]
        body = operation.get("requestBody")
        if body:
            kinds = [f"{media}: {words.type(content.get('schema', {}))}"
                     for media, content in body.get("content", {}).items()]
            out += [f"Request body ({'required' if body.get('required') else 'optional'}): "
                    + "; ".join(kinds) + ".", ""]
        rows = []
        for status, response in sorted(operation.get("responses", {}).items()):
            contents = response.get("content", {})
            body_type = "; ".join(f"{media}: {words.type(c.get('schema', {}))}"
                                  for media, c in contents.items())
            headers = ", ".join(code(h) for h in response.get("headers", {}))
            rows.append([code(status), _text(response.get("description")), body_type,
                         headers])
        out += ["Responses:", "", table(["status", "description", "body", "headers"], rows), ""]
    return out


def _auth(operation: Mapping[str, Any], schemes: Mapping[str, Any]) -> str:
    required = [name for requirement in operation.get("security", ()) for name in requirement]
    if not required:
        return "none"
    kinds = [schemes.get(n, {}).get("scheme", n) for n in required]
    return ", ".join(f"{k} token" for k in kinds) + " (when `api.token_file` is set)"


def _referenced(document: Mapping[str, Any], defs: Mapping[str, Any]) -> list[str]:
    """The component schemas the document's paths reach, sorted."""
    seen: set[str] = set()
    todo = re.findall(r"#/components/schemas/([\w-]+)", json.dumps(document["paths"]))
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        todo += re.findall(r"#/components/schemas/([\w-]+)", json.dumps(defs[name]))
    return sorted(seen)


def api_page() -> str:
    """Every route of the controller's and the agent's HTTP APIs, from the OpenAPI documents
    they serve at ``/openapi.json``, and the schemas of their bodies."""
    from hafo.api.openapi import agent_document, controller_document

    missing = _Missing("reference/api.md")
    documents = {"controller": controller_document(), "agent": agent_document()}
    defs: dict[str, Any] = {}
    for document in documents.values():
        defs.update(document.get("components", {}).get("schemas", {}))

    def link(name: str) -> str:
        if name in _SPEC_LINKS:
            return f"[{name}]({_SPEC_LINKS[name]})"
        return f"[{name}](#{_component_anchor(name)})"

    words = _Words(defs, link, nulls=True)
    first = next(iter(documents.values()))
    out = _header("HTTP API", "the OpenAPI documents of `hafo/api/openapi.py`, which the "
                  "daemons serve at `GET /openapi.json`")
    out += [escape(first["info"].get("description", "")), ""]
    for role, document in documents.items():
        out += _api_section(role, document, words, missing)
    names = sorted({n for d in documents.values() for n in _referenced(d, defs)})
    out += ["## Schemas", "",
            "The request and response bodies (JSON Schema 2020-12, as in the OpenAPI "
            "documents).", ""]
    for name in names:
        out += _schema_section(name, defs[name], words)
    missing.check()
    return "\n".join(out).rstrip() + "\n"


def _hafo_classes() -> dict[str, type]:
    """Name -> class, for the dataclasses of the ``hafo`` modules imported so far."""
    out: dict[str, type] = {}
    for module_name, module in sorted(sys.modules.items()):
        if module_name.startswith("hafo.") and module is not None:
            for value in vars(module).values():
                if isinstance(value, type) and dataclasses.is_dataclass(value) \
                        and value.__module__ == module_name:
                    out.setdefault(value.__name__, value)
    return out


def _schema_section(name: str, schema: Mapping[str, Any], words: _Words) -> list[str]:
    out = [f"### Schema `{name}`", ""]
    if name in _SPEC_LINKS:
        extra = f" {escape(schema.get('description', ''))}" if name == "QueueBody" else ""
        return [*out, f"Field by field: [{name}]({_SPEC_LINKS[name]}).{extra}", ""]
    if "$ref" in schema and len(schema) == 1:
        return [*out, f"The same as {words.type(schema)}.", ""]
    if schema.get("description"):
        out += [escape(schema["description"]), ""]
    properties = schema.get("properties")
    if not properties:
        return [*out, f"A {words.type(schema)}.", ""]
    required = set(schema.get("required", ()))
    cls = _hafo_classes().get(str(schema.get("title", name)))
    rows = []
    for key, prop in properties.items():
        description = prop.get("description") or ""
        if cls is not None and not description:  # its attribute docstring, where it has one
            attribute = _attribute_of(cls, key)
            description = attribute_docs(_declaring(cls, attribute)).get(attribute, "")
        rows.append([code(key), words.type(prop), "yes" if key in required else "no",
                     "; ".join(words.rules(prop)), _text(description)])
    header = ["field", "type", "required", "constraints", "description"]
    for column in (4, 3):  # leave out a column no row has anything in
        if not any(row[column] for row in rows):
            header.pop(column)
            for row in rows:
                row.pop(column)
    return [*out, table(header, rows), ""]


# --- metrics -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MetricDoc:
    """One metric family: its exported name (a counter's with ``_total``), type, labels and
    help text."""

    name: str
    type: str
    labels: tuple[str, ...]
    help: str


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to its end, in a thread of its own where a loop already runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return result[0]


def registry_metrics(registry: Any) -> list[MetricDoc]:
    """Every family ``registry`` exports, from its definitions (labels included even with no
    sample yet)."""
    from prometheus_client.metrics import MetricWrapperBase

    out = []
    for collector in list(registry._collector_to_names):
        if isinstance(collector, MetricWrapperBase):
            found = [(collector._name, collector._type, tuple(collector._labelnames),
                      collector._documentation)]
        else:
            found = [(f.name, f.type, tuple(getattr(f, "_labelnames", ()) or sorted(
                {k for s in f.samples for k in s.labels} - {"le", "quantile"})),
                f.documentation) for f in collector.collect()]
        for name, kind, labels, documentation in found:
            exported = f"{name}_total" if kind == "counter" else name
            out.append(MetricDoc(exported, str(kind), labels, documentation))
    return out


def daemon_metrics() -> dict[str, list[MetricDoc]]:
    """The metric families of a real controller and a real agent (built without etcd, on a
    simulated GPU, never started), by daemon."""
    from hafo.agent.daemon import Agent
    from hafo.controller.daemon import Controller
    from hafo.model.config import parse_config

    async def build() -> dict[str, list[MetricDoc]]:
        with tempfile.TemporaryDirectory() as tmp:
            etcd = {"endpoints": ["http://127.0.0.1:1"]}
            controller = Controller(parse_config(
                {"etcd": etcd, "controller": {"name": "ctl-1"}}, "controller"))
            agent = Agent(parse_config(
                {"etcd": etcd, "checkpoint": {"root": f"{tmp}/checkpoints"},
                 "node": {"name": "node-a", "state_dir": f"{tmp}/state",
                          "gpus": {"simulate": {"count": 1}}}}, "agent"))
            try:
                return {"controller": registry_metrics(controller.registry),
                        "agent": registry_metrics(agent.registry)}
            finally:
                await controller.store.close()
                await agent.close()

    return _run(build())


def metrics_page() -> str:
    """Every metric family the controller and the agent export at ``GET /metrics``."""
    missing = _Missing("reference/metrics.md")
    by_daemon = daemon_metrics()
    names = {role: {m.name: m for m in metrics} for role, metrics in by_daemon.items()}
    both = sorted(set(names["controller"]) & set(names["agent"]))
    groups = {"Both daemons": [names["controller"][n] for n in both]}
    for role in ("controller", "agent"):
        groups[role.capitalize()] = sorted(
            (m for n, m in names[role].items() if n not in both), key=lambda m: m.name)
    out = _header("Metrics", "the metric definitions of `hafo/controller/`, `hafo/agent/` "
                  "and `hafo/store/`, as a controller and an agent register them")
    out += ["Prometheus text at `GET /metrics` of each daemon. A counter is exported under "
            "its `_total` name.", ""]
    for title, metrics in groups.items():
        rows = []
        for metric in metrics:
            if not _text(metric.help):
                missing.add(f"metric {metric.name}")
            rows.append([code(metric.name), metric.type,
                         ", ".join(code(label) for label in metric.labels),
                         _text(metric.help)])
        out += [f"## {title}", "", table(["metric", "type", "labels", "help"], rows), ""]
    missing.check()
    return "\n".join(out).rstrip() + "\n"


# --- events ---------------------------------------------------------------------------------------

def events_page() -> str:
    """The event log's records and kinds, the causes of the leader's decisions and how an
    instance ends."""
    from hafo.decisions.plan import Cause
    from hafo.model.cluster import Event
    from hafo.model.ends import InstanceEnd
    from hafo.store.events import EVENT_KINDS, EventKind

    missing = _Missing("reference/events.md")
    undeclared = [kind for kind in EVENT_KINDS if kind not in set(EventKind)]
    for kind in undeclared:
        missing.add(f"EventKind: no member for event kind {kind!r}")
    out = _header("Events", "`hafo/store/events.py`, `hafo/model/cluster.py`, "
                  "`hafo/decisions/plan.py`, `hafo/model/ends.py`")
    out += ["## Event kinds", "", _first_paragraph(EventKind.__doc__), "",
            table(["kind", "meaning"], enum_rows(EventKind, missing)), ""]
    out += ["## Event records", "",
            f"{_first_paragraph(Event.__doc__)} Each is a JSON object (`GET /v1/events`, "
            "`hafo events --json`):", "",
            fields_table(field_docs(Event), missing), ""]
    out += ["## Causes", "", _first_paragraph(Cause.__doc__), "",
            "A cause is the `cause` of the leader's `decision` log lines, and the `cause` "
            "label of `hafo_failovers_total`, `hafo_restarts_total`, "
            "`hafo_detection_seconds` and `hafo_recovery_seconds` ([Metrics](metrics.md)).",
            "",
            table(["cause", "meaning"], enum_rows(Cause, missing)), ""]
    out += ["## Instance ends", "", _first_paragraph(InstanceEnd.__doc__), "",
            table(["end", "meaning"], enum_rows(InstanceEnd, missing)), ""]
    missing.check()
    return "\n".join(out).rstrip() + "\n"


#: Each page's path under ``docs/`` and the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/config.md": config_page,
    "reference/spec.md": spec_page,
    "reference/cli.md": cli_page,
    "reference/api.md": api_page,
    "reference/metrics.md": metrics_page,
    "reference/events.md": events_page,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the page named on the command line (``config``, ``spec``...)."""
    names = list(sys.argv[1:] if argv is None else argv)
    pages = {Path(uri).stem: function for uri, function in PAGES.items()}
    if len(names) != 1 or names[0] not in pages:
        print(f"usage: docs_reference.py {{{','.join(pages)}}}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(pages[names[0]]())
    except UndocumentedError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
