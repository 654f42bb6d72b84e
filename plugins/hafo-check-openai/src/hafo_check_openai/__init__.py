"""hafo check type ``openai``: is an OpenAI-compatible inference server really serving?

One probe, in order (the first failure ends it):

1. ``GET {base_url}{health_path}`` must answer 2xx (skipped when ``health_path`` is null/"").
2. With ``max_queue``: ``GET {base_url}{metrics_path}`` (Prometheus text); the waiting-requests
   gauge, summed over its label sets, must not exceed ``max_queue``.
3. With ``probe_request`` (default): ``POST {base_url}/v1/completions`` with a one-token
   request must answer 200 with a ``choices`` list. Without ``model``, the first id listed by
   ``GET {base_url}/v1/models`` is used (looked up once per instance).

The server is ``base_url``, or ``http://{host}:{port}`` where ``port`` may name one of the
spec's ``ports`` (resolved on the node: a port hafo chose works; ``host`` defaults to
127.0.0.1). Works with vLLM, TGI, SGLang and the llama.cpp server. Registered as the entry point
``openai`` in the group ``hafo.checks``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from hafo.checks.api import CheckContext, CheckOptionError, CheckResult

__all__ = [
    "DEFAULT_QUEUE_METRICS",
    "OpenAICheck",
    "make_check",
    "sum_metric",
]

DEFAULT_QUEUE_METRICS: tuple[str, ...] = (
    "vllm:num_requests_waiting",
    "tgi_queue_size",
    "sglang:num_queue_reqs",
    "llamacpp:requests_deferred",
)
"""Waiting-requests gauges looked for, in order, when ``queue_metric`` is not set."""

_OPTIONS = frozenset({
    "base_url", "port", "host", "health_path", "model", "probe_request", "max_queue",
    "queue_metric", "metrics_path", "api_key_env",
})
_BODY_SNIPPET = 200

# name, optional {labels} (quoted values may hold any character), value.
_SAMPLE = re.compile(
    r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)'
)


def sum_metric(text: str, name: str) -> float | None:
    """The sum of every sample of ``name`` in Prometheus text ``text`` (NaN samples skipped);
    None when no sample of ``name`` is present."""
    total: float | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith(name):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) != name:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        total = (total or 0.0) + (0.0 if math.isnan(value) else value)
    return total


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _BODY_SNIPPET else text[:_BODY_SNIPPET] + "..."


def _path_option(options: Mapping[str, Any], key: str, default: str | None) -> str | None:
    value = options.get(key, default)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        raise CheckOptionError(key, f"must be a path starting with '/', got {value!r}")
    return value


@dataclass
class OpenAICheck:
    """A configured ``openai`` check (see the module docstring)."""

    base_url: str
    health_path: str | None = "/health"
    port: int | str | None = None  # instead of base_url: http://host:port, a name resolved
    host: str = "127.0.0.1"        # through the instance's ports (ctx.ports)
    model: str | None = None
    probe_request: bool = True
    max_queue: int | None = None
    queue_metric: str | None = None
    metrics_path: str = "/metrics"
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        self._discovered_model: str | None = None
        self._base = self.base_url

    def _url(self, path: str) -> str:
        return self._base + path

    def _base_for(self, ctx: CheckContext) -> str | None:
        """The server's base URL for this instance (None: a port name it does not have)."""
        if self.port is None:
            return self.base_url
        port = ctx.ports.get(self.port) if isinstance(self.port, str) else self.port
        if port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    def _headers(self, ctx: CheckContext) -> dict[str, str] | str:
        """Request headers, or a failure detail when the API key cannot be found."""
        if self.api_key_env is None:
            return {}
        token = ctx.env.get(self.api_key_env)
        if not token:
            return f"api_key_env: {self.api_key_env} is not set in the workload's env"
        return {"Authorization": f"Bearer {token}"}

    async def probe(self, ctx: CheckContext) -> CheckResult:
        """Look at the server once; the agent bounds the call with the check's ``timeout``."""
        headers = self._headers(ctx)
        if isinstance(headers, str):
            return CheckResult(False, headers)
        base = self._base_for(ctx)
        if base is None:
            return CheckResult(False, f"port: no port named {self.port!r} on this instance")
        self._base = base
        seen: list[str] = []
        try:
            async with aiohttp.ClientSession(headers=headers) as session:
                if self.health_path is not None:
                    async with session.get(self._url(self.health_path)) as resp:
                        if not 200 <= resp.status < 300:
                            body = _snippet(await resp.text(errors="replace"))
                            return CheckResult(False, f"health {resp.status}"
                                               + (f": {body}" if body else ""))
                    seen.append("health ok")
                if self.max_queue is not None:
                    failed = await self._check_queue(session, seen)
                    if failed is not None:
                        return failed
                if self.probe_request:
                    failed = await self._check_completion(session, seen)
                    if failed is not None:
                        return failed
        except aiohttp.ClientError as exc:
            return CheckResult(False, f"{self._base}: {type(exc).__name__}: {exc}")
        return CheckResult(True, ", ".join(seen))

    async def _check_queue(self, session: aiohttp.ClientSession,
                           seen: list[str]) -> CheckResult | None:
        assert self.max_queue is not None
        async with session.get(self._url(self.metrics_path)) as resp:
            if resp.status != 200:
                return CheckResult(False, f"metrics {resp.status}")
            text = await resp.text(errors="replace")
        names = (self.queue_metric,) if self.queue_metric else DEFAULT_QUEUE_METRICS
        for name in names:
            queue = sum_metric(text, name)
            if queue is not None:
                break
        else:
            return CheckResult(False, f"no queue metric in {self.metrics_path} "
                                      f"(looked for {', '.join(names)})")
        shown = f"{queue:g}"
        if queue > self.max_queue:
            return CheckResult(False, f"queue {shown} > max_queue {self.max_queue}")
        seen.append(f"queue {shown}")
        return None

    async def _resolve_model(self, session: aiohttp.ClientSession) -> str | CheckResult:
        if self.model is not None:
            return self.model
        if self._discovered_model is not None:
            return self._discovered_model
        async with session.get(self._url("/v1/models")) as resp:
            text = await resp.text(errors="replace")
            if resp.status != 200:
                return CheckResult(False, f"models returned {resp.status}: {_snippet(text)}")
        try:
            data = json.loads(text)["data"]
            model = str(data[0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            return CheckResult(False, f"models listed no model id: {_snippet(text)}")
        self._discovered_model = model
        return model

    async def _check_completion(self, session: aiohttp.ClientSession,
                                seen: list[str]) -> CheckResult | None:
        model = await self._resolve_model(session)
        if isinstance(model, CheckResult):
            return model
        body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
        async with session.post(self._url("/v1/completions"), json=body) as resp:
            text = await resp.text(errors="replace")
            if resp.status != 200:
                return CheckResult(False, f"completion returned {resp.status}: {_snippet(text)}")
        try:
            choices = json.loads(text)["choices"]
        except (ValueError, KeyError, TypeError):
            choices = None
        if not isinstance(choices, list):
            return CheckResult(False, f"completion returned no choices list: {_snippet(text)}")
        seen.append(f"completion ok ({model})")
        return None


def make_check(options: Mapping[str, Any]) -> OpenAICheck:
    """The ``openai`` check factory: validate ``options`` and build the check.

    Raises ``CheckOptionError`` naming the first bad option.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise CheckOptionError(unknown[0], f"unknown option (known: {', '.join(sorted(_OPTIONS))})")

    port = options.get("port")
    if port is not None and not (
            (isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535)
            or (isinstance(port, str) and re.fullmatch(r"[a-z][a-z0-9_]{0,14}", port))):
        raise CheckOptionError("port", "must be a port number or the name of a declared port")
    host = options.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise CheckOptionError("host", "must be a host name or address")
    base_url = options.get("base_url")
    if port is not None:
        if base_url is not None:
            raise CheckOptionError("port", "give base_url or port, not both")
        base_url = f"http://{host}:{port if isinstance(port, int) else 1}"
    if not isinstance(base_url, str) or not base_url:
        raise CheckOptionError("base_url", "required (or port): the server's URL, e.g. "
                                           "http://127.0.0.1:8000")
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CheckOptionError("base_url", f"must be an http(s) URL with a host, got {base_url!r}")
    if parts.query or parts.fragment:
        raise CheckOptionError("base_url", "must not have a query or fragment")
    base_url = base_url.rstrip("/")
    base_url = base_url.removesuffix("/v1")  # OpenAI-client style base URLs are accepted too

    model = options.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise CheckOptionError("model", "must be a non-empty string")

    probe_request = options.get("probe_request", True)
    if not isinstance(probe_request, bool):
        raise CheckOptionError("probe_request", "must be true or false")

    max_queue = options.get("max_queue")
    if max_queue is not None and (
            isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0):
        raise CheckOptionError("max_queue", "must be an integer >= 0")

    queue_metric = options.get("queue_metric")
    if queue_metric is not None and (
            not isinstance(queue_metric, str) or not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*",
                                                                  queue_metric)):
        raise CheckOptionError("queue_metric", "must be a Prometheus metric name")

    api_key_env = options.get("api_key_env")
    if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
        raise CheckOptionError("api_key_env", "must be the name of an environment variable")

    metrics_path = _path_option(options, "metrics_path", "/metrics")
    if metrics_path is None:
        raise CheckOptionError("metrics_path", "must be a path starting with '/'")

    health_path = _path_option(options, "health_path", "/health")
    if health_path is None and max_queue is None and not probe_request:
        raise CheckOptionError("probe_request", "nothing to check: health_path is off, "
                                                "max_queue unset and probe_request false")
    return OpenAICheck(
        base_url=base_url,
        port=port,
        host=host,
        health_path=health_path,
        model=model,
        probe_request=probe_request,
        max_queue=max_queue,
        queue_metric=queue_metric,
        metrics_path=metrics_path,
        api_key_env=api_key_env,
    )
