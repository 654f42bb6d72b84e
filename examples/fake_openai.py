"""A fake OpenAI-compatible inference server (aiohttp only): what the ``openai`` check plugin
(plugins/hafo-check-openai) probes, with no model behind it.

    GET  /health               200 when ready; 503 "starting" during ``--startup-delay``,
                               "engine dead" when broken (``what=health``), "stopping" on drain
    GET  /v1/models            {"object": "list", "data": [{"id": MODEL, "object": "model"...}]}
    POST /v1/completions       {"model", "prompt", "max_tokens"...} -> a ``text_completion``
                               with a ``choices`` list; 500 with an OpenAI error body once broken
    POST /v1/chat/completions  {"model", "messages"...} -> a ``chat.completion``
    GET  /metrics              Prometheus text: ``vllm:num_requests_waiting`` (set with
                               /admin/queue) and ``vllm:num_requests_running``
    POST /admin/break          start failing: ``?what=completions`` (default: health still 200,
                               as an engine with a dead CUDA context), ``health`` or ``all``
    POST /admin/fix            serve normally again
    POST /admin/queue?waiting=N  the waiting-requests gauge /metrics reports
    GET  /admin/state          {"state", "broken", "completed", "waiting"}

``--fail-after N`` breaks the completions by itself after N successful ones. An unknown model
answers 404, a malformed body 400, a request before the server is ready 503 (all with an
OpenAI-style ``{"error": {...}}`` body).

It listens on ``--host`` (0.0.0.0) port ``--port``, else ``$HAFO_PORT_HTTP``, else ``$PORT``,
else 8000. SIGTERM drains it as examples/http_service.py does: no new connection, requests in
flight answered (within ``--drain-timeout``), exit 0.

Under hafo: ``hafo submit examples/openai-service.yaml``. By hand:

    python3 examples/fake_openai.py --port 8000 --startup-delay 3
    curl -s 127.0.0.1:8000/v1/completions -d '{"model": "fake-model", "prompt": "hi"}'
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

NAME = "fake_openai"
BREAKABLE = ("completions", "health", "all")
MAX_TOKENS = 64

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def log(message: str) -> None:
    """One line on stdout, at once."""
    print(f"{NAME}: {message}", flush=True)


def error(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-style error answer."""
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)


class FakeEngine:
    """The server's state: ``starting`` -> ``ready`` -> ``stopping``, and what is broken."""

    def __init__(self, model: str, fail_after: int | None, token_delay: float) -> None:
        self.model = model
        self.fail_after = fail_after
        self.token_delay = token_delay
        self.state = "starting"
        self.broken: set[str] = set()
        self.waiting = 0
        self.running = 0  # generations in progress
        self.in_flight = 0  # requests in flight
        self.completed = 0
        self.ids = itertools.count(1)
        self.created = int(time.time())

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Count requests in flight; once stopping, every answer closes its connection."""
        self.in_flight += 1
        try:
            response = await handler(request)
        finally:
            self.in_flight -= 1
        if self.state == "stopping" and not response.prepared:
            response.force_close()
        return response

    # --- the OpenAI-compatible surface ----------------------------------------------------

    async def health(self, _: web.Request) -> web.Response:
        """200 (empty body, as vLLM) when ready and not broken, else 503 with the reason."""
        if self.state != "ready":
            return web.Response(status=503, text=f"{self.state}\n")
        if self.broken & {"health", "all"}:
            return web.Response(status=503, text="engine dead\n")
        return web.Response()

    async def models(self, _: web.Request) -> web.Response:
        """The one model served."""
        if self.state == "starting":
            return error(503, "the model is loading", "service_unavailable")
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": self.created,
             "owned_by": "hafo-example", "root": self.model, "max_model_len": 2048}]})

    async def _generate(self, request: web.Request) -> tuple[dict[str, Any], str] | web.Response:
        """Validate a completion request and 'generate': (its body, the text) or an error."""
        if self.state == "starting":
            return error(503, "the model is loading", "service_unavailable")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object", "invalid_request_error")
        if body.get("model") != self.model:
            return error(404, f"The model `{body.get('model')}` does not exist.",
                         "NotFoundError")
        if self.broken & {"completions", "all"}:
            return error(500, "CUDA error: an illegal memory access was encountered",
                         "InternalServerError")
        max_tokens = body.get("max_tokens", 16)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return error(400, "max_tokens must be an integer >= 1", "invalid_request_error")
        tokens = min(max_tokens, MAX_TOKENS)
        self.running += 1
        try:
            if self.token_delay:
                await asyncio.sleep(self.token_delay * tokens)
        finally:
            self.running -= 1
        self.completed += 1
        if self.fail_after is not None and self.completed >= self.fail_after:
            if "completions" not in self.broken:
                log(f"breaking after {self.completed} completion(s) (--fail-after)")
            self.broken.add("completions")
        return body, " ".join(["pong"] * tokens)

    def _usage(self, prompt_tokens: int, tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens}

    async def completions(self, request: web.Request) -> web.Response:
        """``POST /v1/completions``."""
        generated = await self._generate(request)
        if isinstance(generated, web.Response):
            return generated
        body, text = generated
        tokens = len(text.split())
        return web.json_response({
            "id": f"cmpl-{next(self.ids)}", "object": "text_completion",
            "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": "length"}],
            "usage": self._usage(len(str(body.get("prompt", "")).split()), tokens)})

    async def chat(self, request: web.Request) -> web.Response:
        """``POST /v1/chat/completions``."""
        generated = await self._generate(request)
        if isinstance(generated, web.Response):
            return generated
        body, text = generated
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error(400, "messages must be a non-empty list", "invalid_request_error")
        prompt = sum(len(str(m.get("content", "")).split()) for m in messages
                     if isinstance(m, dict))
        return web.json_response({
            "id": f"chatcmpl-{next(self.ids)}", "object": "chat.completion",
            "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length"}],
            "usage": self._usage(prompt, len(text.split()))})

    async def metrics(self, _: web.Request) -> web.Response:
        """vLLM's queue gauges, in Prometheus text."""
        labels = f'{{model_name="{self.model}"}}'
        text = (
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} {float(self.waiting)}\n"
            "# HELP vllm:num_requests_running Number of requests in model execution.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {float(self.running)}\n"
        )
        return web.Response(text=text, content_type="text/plain")

    # --- test controls --------------------------------------------------------------------

    async def admin_state(self, _: web.Request) -> web.Response:
        """What is broken, how many completions were served."""
        return self._state()

    def _state(self) -> web.Response:
        return web.json_response({"state": self.state, "broken": sorted(self.broken),
                                  "completed": self.completed, "waiting": self.waiting})

    async def admin_break(self, request: web.Request) -> web.Response:
        """Start failing: ``?what=completions|health|all``."""
        what = request.query.get("what", "completions")
        if what not in BREAKABLE:
            return web.json_response({"error": f"what must be one of {', '.join(BREAKABLE)}"},
                                     status=400)
        self.broken.add(what)
        log(f"broken: {what}")
        return self._state()

    async def admin_fix(self, _: web.Request) -> web.Response:
        """Serve normally again (``--fail-after`` does not break it again)."""
        self.broken.clear()
        self.fail_after = None
        log("fixed")
        return self._state()

    async def admin_queue(self, request: web.Request) -> web.Response:
        """Set the waiting-requests gauge: ``?waiting=N``."""
        raw = request.query.get("waiting", "")
        if not raw.isdigit():
            return web.json_response({"error": "waiting must be an integer >= 0"}, status=400)
        self.waiting = int(raw)
        return self._state()

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self.track])
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/admin/break", self.admin_break)
        app.router.add_post("/admin/fix", self.admin_fix)
        app.router.add_post("/admin/queue", self.admin_queue)
        app.router.add_get("/admin/state", self.admin_state)
        return app


async def serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain; the exit status."""
    engine = FakeEngine(args.model, args.fail_after, args.token_delay)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(engine.app(), handle_signals=False, access_log=None,
                           shutdown_timeout=args.drain_timeout)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as exc:
        await runner.cleanup()
        log(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 1
    port = runner.addresses[0][1] if runner.addresses else args.port
    log(f"serving {args.model} on {args.host}:{port} (pid {os.getpid()}), "
        f"ready in {args.startup_delay:g}s")

    async def become_ready() -> None:
        await asyncio.sleep(args.startup_delay)
        if engine.state == "starting":
            engine.state = "ready"
            log("ready")

    ready = asyncio.create_task(become_ready())
    await stop.wait()
    ready.cancel()
    engine.state = "stopping"
    started = time.monotonic()
    log(f"draining: {engine.in_flight} request(s) in flight, up to {args.drain_timeout:g}s")
    await runner.cleanup()
    log(f"stopped after {time.monotonic() - started:.2f}s of drain; "
        f"{engine.completed} completion(s) served")
    return 0


def non_negative(text: str) -> float:
    """argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="fake_openai.py", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (0.0.0.0)")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default: $HAFO_PORT_HTTP, $PORT, else 8000)")
    parser.add_argument("--model", default="fake-model", help="the model id served (fake-model)")
    parser.add_argument("--startup-delay", type=non_negative, default=0.0, metavar="SECONDS",
                        help="answer 503 this long after start, as a model loading (0)")
    parser.add_argument("--fail-after", type=positive_int, default=None, metavar="N",
                        help="completions fail (500) after N successful ones")
    parser.add_argument("--token-delay", type=non_negative, default=0.0, metavar="SECONDS",
                        help="time per generated token (0)")
    parser.add_argument("--drain-timeout", type=non_negative, default=25.0, metavar="SECONDS",
                        help="on SIGTERM, wait this long for requests in flight (25)")
    args = parser.parse_args(argv)
    if args.port is None:
        args.port = 8000
        for var in ("HAFO_PORT_HTTP", "PORT"):
            value = os.environ.get(var, "").strip()
            if value:
                if not value.isdigit():
                    parser.error(f"${var} is not a port number: {value!r}")
                args.port = int(value)
                break
    if not 0 <= args.port <= 65535:
        parser.error(f"port out of range: {args.port}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the server; the exit status."""
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
