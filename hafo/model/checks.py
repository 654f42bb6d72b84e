"""Application checks in a workload spec: the fields every check has, and the options of
each built-in type, declared once.

The spec validation checks a built-in check's options with these declarations at submit
time, and each built-in check's constructor (``hafo.checks.builtin``) reads its options
with the same ones on the agent; a plugin type's options are the plugin's to check.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainValidator,
    Strict,
    WithJsonSchema,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from hafo.model.schema import (
    INTEGER,
    Argv,
    Flag,
    Matches,
    NonNegative,
    OneOrMore,
    Positive,
    Schema,
    Section,
    StrMap,
    Text,
    integral,
    invalid,
)

# --- built-in check types ------------------------------------------------------------------

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: An http:// or https:// URL with a host (a name, an IPv4 or a bracketed IPv6 address).
HTTP_URL = (r"[Hh][Tt][Tt][Pp][Ss]?://([^\x00-\x20/?#@\[\]]*@)?"
            r"([^\x00-\x20/?#@\[\]:]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?([/?#][^\x00-\x20]*)?")
#: An HTTP method of ``HTTP_METHODS``, in any case.
HTTP_METHOD = "|".join("".join(f"[{c}{c.lower()}]" for c in m) for m in HTTP_METHODS)
StatusCode = Annotated[int, Field(ge=100, le=599), INTEGER]
PORT_NAME = r"[a-z][a-z0-9_]{0,14}"
_PORT_NAME_RE = re.compile(PORT_NAME)


def _port_ref(value: Any) -> int | str:
    value = integral(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    if isinstance(value, str) and _PORT_NAME_RE.fullmatch(value):
        return value
    invalid((), "must be a port number (1-65535) or the name of a declared port", value)


#: A port: its number, or the name of one of the spec's ``ports`` (resolved on the node, where
#: a port hafo chose is known).
PortRef = Annotated[int | str, PlainValidator(_port_ref), WithJsonSchema({"oneOf": [
    {"type": "integer", "minimum": 1, "maximum": 65535},
    {"type": "string", "pattern": f"^{PORT_NAME}$"}]})]


@dataclass(frozen=True, kw_only=True)
class HttpOptions(Section):
    """``http``: a request whose status (2xx/3xx, or ``expect_status``) and optionally body
    (``body_contains``) say healthy. Redirects are not followed. The target is ``url``, or
    ``scheme``://``host``:``port````path`` where ``port`` may name a declared port."""

    url: Annotated[str, Strict(), Matches(HTTP_URL, "must be an http:// or https:// URL "
                                                    "with a host")] | None = None
    """The URL to probe, http or https; else `port`, with `path`, `host` and `scheme`. One of
    `url` and `port` is required."""
    port: PortRef | None = None
    """The port to probe: a number, or the name of a declared port (resolved on the node)."""
    path: Annotated[str, Strict(), Matches(r"/[^\x00-\x20]*", "must start with '/'")] = "/"
    """The path to probe on `port`."""
    host: Text = "127.0.0.1"
    """The host to probe on `port`."""
    scheme: Literal["http", "https"] = "http"
    """`http` or `https`, on `port`."""
    method: Annotated[str, Strict(), Matches(HTTP_METHOD, f"must be one of "
                                                          f"{', '.join(HTTP_METHODS)}"),
                      AfterValidator(str.upper)] = "GET"
    """The request's method, in any case: GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS."""
    expect_status: Annotated[tuple[StatusCode, ...], Field(min_length=1), OneOrMore()] = ()
    """The status code(s) that say healthy: one code or a list; none given: any 2xx or 3xx."""
    body_contains: Text | None = None
    """Text the first MiB of the body must contain."""
    headers: StrMap = field(default_factory=dict)
    """The request's headers."""

    def _check(self) -> None:
        if self.url is None and self.port is None:
            invalid("url", "give url, or port (a number or a declared port's name)")

    def target(self, ports: Mapping[str, int]) -> str:
        """The URL to probe, with a named port resolved through ``ports`` (KeyError: not
        declared)."""
        if self.url is not None and self.port is None:
            return self.url
        port = ports[self.port] if isinstance(self.port, str) else self.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{port}{self.path}"


@dataclass(frozen=True, kw_only=True)
class TcpOptions(Section):
    """``tcp``: a connection to ``host``:``port`` opens (``port`` may name a declared
    port)."""

    host: Text = "127.0.0.1"
    """The host to connect to."""
    port: PortRef
    """The port to connect to: a number, or the name of a declared port (resolved on the node)."""


@dataclass(frozen=True, kw_only=True)
class ExecOptions(Section):
    """``exec``: ``command`` (argv, no shell) exits 0; with the workload's environment plus
    ``env``, in ``cwd`` (default: the agent's working directory)."""

    command: Argv
    """The command (argv, no shell); exit 0 is healthy. Its process group is killed at the
    timeout."""
    env: StrMap = field(default_factory=dict)
    """Added to the workload's environment for the command."""
    cwd: Text | None = None
    """The command's working directory (default: the agent's)."""


@dataclass(frozen=True, kw_only=True)
class ProcessOptions(Section):
    """``process``: the workload's process is alive, not a zombie or stopped, and uses at
    most ``max_rss_mib`` of memory."""

    max_rss_mib: Annotated[int, Field(ge=1), INTEGER] | None = None
    """The most resident memory, in MiB, the workload's process may use."""


@dataclass(frozen=True, kw_only=True)
class ProgressOptions(Section):
    """``progress``: the workload reported progress (SDK heartbeat, or a touch of ``file``,
    relative to its checkpoint directory) within ``stall_after`` seconds."""

    stall_after: Positive
    """Seconds without progress (no change of the heartbeat, or of the file's mtime or size)
    before the check fails, on the agent's monotonic clock."""
    file: Text | None = None
    """The file whose change is progress, relative to the checkpoint directory (default: the
    SDK's `heartbeat.json`)."""


HTTP_OPTIONS: Schema[HttpOptions] = Schema(HttpOptions, "options", prefix="")
TCP_OPTIONS: Schema[TcpOptions] = Schema(TcpOptions, "options", prefix="")
EXEC_OPTIONS: Schema[ExecOptions] = Schema(ExecOptions, "options", prefix="")
PROCESS_OPTIONS: Schema[ProcessOptions] = Schema(ProcessOptions, "options", prefix="")
PROGRESS_OPTIONS: Schema[ProgressOptions] = Schema(ProgressOptions, "options", prefix="")

# --- a check in a spec -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CheckTiming(Section):
    """When a check runs: every ``interval`` seconds (after ``initial_delay``), each probe
    within ``timeout``; ``failure_threshold`` failures in a row fail the instance (unless
    ``liveness`` is false). ``readiness``: the instance is ready only while this check's last
    probe passed (docs/reference/workloads.md, "Readiness")."""

    interval: Positive = 10.0
    """Seconds between probes."""
    timeout: Positive = 5.0
    """Seconds one probe may take."""
    failure_threshold: Annotated[int, Field(ge=1), INTEGER] = 3
    """Failed probes in a row before the instance counts as failing."""
    initial_delay: NonNegative = 0.0
    """Seconds before the first probe."""
    readiness: Flag = True
    """The instance is ready (in rotation) only while this check's last probe passed."""
    liveness: Flag = True
    """Failing past `failure_threshold` restarts the instance; false: the check only gates
    readiness."""


@dataclass(frozen=True, kw_only=True)
class HttpCheckSpec(HttpOptions, CheckTiming):
    """An ``http`` check (its options, then the timing every check has)."""

    type: Literal["http"]
    """`http`: an HTTP request."""


@dataclass(frozen=True, kw_only=True)
class TcpCheckSpec(TcpOptions, CheckTiming):
    """A ``tcp`` check."""

    type: Literal["tcp"]
    """`tcp`: a TCP connection."""


@dataclass(frozen=True, kw_only=True)
class ExecCheckSpec(ExecOptions, CheckTiming):
    """An ``exec`` check."""

    type: Literal["exec"]
    """`exec`: a command."""


@dataclass(frozen=True, kw_only=True)
class ProcessCheckSpec(ProcessOptions, CheckTiming):
    """A ``process`` check."""

    type: Literal["process"]
    """`process`: the workload's process."""


@dataclass(frozen=True, kw_only=True)
class ProgressCheckSpec(ProgressOptions, CheckTiming):
    """A ``progress`` check."""

    type: Literal["progress"]
    """`progress`: the workload's progress reports."""


#: The built-in check types and the JSON form of a check of each.
BUILTIN_CHECKS: dict[str, type[Section]] = {
    "http": HttpCheckSpec, "tcp": TcpCheckSpec, "exec": ExecCheckSpec,
    "process": ProcessCheckSpec, "progress": ProgressCheckSpec,
}
BUILTIN_CHECK_TYPES = tuple(BUILTIN_CHECKS)


@dataclass(frozen=True, kw_only=True)
class PluginCheckSpec(CheckTiming):
    """A check of a type a plugin provides (entry-point group ``hafo.checks``): its other
    fields are the plugin's options, checked by the plugin on the agent."""

    __pydantic_config__ = ConfigDict(extra="allow")
    type: Annotated[str, Strict(), Field(min_length=1, json_schema_extra={
        "not": {"enum": list(BUILTIN_CHECK_TYPES)}})]
    """A type a plugin provides (entry-point group `hafo.checks`); its other fields are the
    plugin's options, checked by the plugin on the agent."""


_TIMING_KEYS = frozenset({"type", "interval", "timeout", "failure_threshold", "initial_delay",
                          "readiness", "liveness"})
_FORMS: dict[str, Schema[Any]] = {name: Schema(form, "check")
                                  for name, form in BUILTIN_CHECKS.items()}
_PLUGIN: Schema[PluginCheckSpec] = Schema(PluginCheckSpec, "check")


def _as_check(raw: Any) -> CheckSpec:
    """A check's JSON form (one flat mapping) as a ``CheckSpec``."""
    if not isinstance(raw, Mapping):
        invalid((), f"must be a mapping, got {type(raw).__name__}", raw)
    kind = raw.get("type")
    form = _FORMS.get(kind) if isinstance(kind, str) else None
    if form is not None:
        timing: CheckTiming = form.validator.validate_python(raw)
    else:
        timing = _PLUGIN.validator.validate_python(
            {k: v for k, v in raw.items() if k in _TIMING_KEYS})
    return CheckSpec(type=kind, interval=timing.interval,  # type: ignore[arg-type]
                     timeout=timing.timeout, failure_threshold=timing.failure_threshold,
                     initial_delay=timing.initial_delay, readiness=timing.readiness,
                     liveness=timing.liveness,
                     options={k: v for k, v in raw.items() if k not in _TIMING_KEYS})


@dataclass(frozen=True)
class CheckSpec(CheckTiming):
    """One application check of a spec; ``options`` keeps the type-specific fields as given.

    Its JSON form is one flat mapping: ``type``, the timing fields and the options. A
    built-in type's options are checked against its declaration (``HttpOptions``...)."""

    type: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> CoreSchema:
        # the JSON Schema: one of the forms; validation: the form the type names
        forms = handler.generate_schema(Union[(*BUILTIN_CHECKS.values(), PluginCheckSpec)])

        def flat(check: CheckSpec) -> dict[str, Any]:
            return {"type": check.type, "interval": check.interval, "timeout": check.timeout,
                    "failure_threshold": check.failure_threshold,
                    "initial_delay": check.initial_delay,
                    **({} if check.readiness else {"readiness": False}),
                    **({} if check.liveness else {"liveness": False}), **dict(check.options)}

        def dispatch(raw: Any, _forms: Callable[[Any], Any]) -> CheckSpec:
            return _as_check(raw)

        return core_schema.no_info_wrap_validator_function(
            dispatch, forms, serialization=core_schema.plain_serializer_function_ser_schema(flat))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), "description": "An application check: `type` (built in: "
                f"{', '.join(BUILTIN_CHECK_TYPES)}; plugins add more), the timing every check "
                "has and the type's own options."}
