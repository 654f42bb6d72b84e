"""hafo's one API client (``hafo.api.client``) against a real aiohttp server on 127.0.0.1:
answers and failures as typed errors, their CLI exit codes, the bearer token, the timeout,
TLS, and loading the token and the CA."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hafo.api.client import (
    ApiBadAnswer,
    ApiClient,
    ApiError,
    ApiForbidden,
    ApiRefused,
    ApiSetupError,
    ApiStatusError,
    ApiTimeout,
    ApiUnavailable,
    ApiUnreachable,
    cli_error,
    client_tls,
    error_text,
    load_access,
)
from hafo.api.server import server_tls
from hafo.exits import EXIT_REFUSED, EXIT_UNAVAILABLE, EXIT_USAGE

TOKEN = "s3cret-token-0123456789"
WHO = "node-1's agent"


async def status(request: web.Request) -> web.Response:
    """``/status/N``: answers N with the JSON error ``no: N`` (``?plain``: a text body)."""
    code = int(request.match_info["code"])
    if "plain" in request.query:
        return web.Response(status=code, text="plain words " * 40)
    return web.json_response({"error": f"no: {code}"}, status=code)


async def echo(request: web.Request) -> web.Response:
    """The request's method, Authorization header, query and JSON body."""
    body = await request.json() if request.can_read_body else None
    return web.json_response({"method": request.method,
                              "authorization": request.headers.get("Authorization"),
                              "query": dict(request.query), "body": body})


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(5)
    return web.json_response({})


async def not_json(request: web.Request) -> web.Response:
    return web.Response(text="{not json")


def app() -> web.Application:
    application = web.Application()
    application.router.add_get("/status/{code}", status)
    application.router.add_route("*", "/echo", echo)
    application.router.add_get("/slow", slow)
    application.router.add_get("/not-json", not_json)
    return application


@pytest.fixture
async def base() -> AsyncIterator[str]:
    async with TestServer(app(), host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("code", "kind", "message", "exit_code"), [
    (401, ApiRefused, f"{WHO} refused: no: 401 (give the token with --api-token-file)",
     EXIT_REFUSED),
    (403, ApiForbidden, f"{WHO} refused: no: 403", EXIT_REFUSED),
    (404, ApiStatusError, f"{WHO} answered 404: no: 404", 1),
    (409, ApiStatusError, f"{WHO} answered 409: no: 409", 1),
    (500, ApiStatusError, f"{WHO} answered 500: no: 500", 1),
    (503, ApiStatusError, f"{WHO} answered 503: no: 503", 1),
])
async def test_answers_that_are_not_2xx_are_typed_errors(
        base: str, code: int, kind: type[ApiStatusError], message: str,
        exit_code: int) -> None:
    async with ApiClient() as client:
        answer = await client.get(base, f"/status/{code}", who=WHO)
        assert answer.status == code and not answer.ok
        with pytest.raises(ApiStatusError) as info:
            answer.raise_for_status()
    assert type(info.value) is kind
    assert (info.value.status, info.value.why, info.value.who) == (code, f"no: {code}", WHO)
    error = cli_error(info.value)
    assert (str(error), error.code) == (message, exit_code)


@pytest.mark.parametrize("code", [200, 201, 204])
async def test_2xx_answers_pass(base: str, code: int) -> None:
    async with ApiClient() as client:
        answer = await client.get(base, f"/status/{code}")
    assert answer.ok and answer.raise_for_status() is answer


async def test_an_error_that_is_not_json_is_quoted_in_part(base: str) -> None:
    async with ApiClient() as client:
        answer = await client.get(base, "/status/502", params={"plain": "1"}, who=WHO)
    with pytest.raises(ApiStatusError) as info:
        answer.raise_for_status()
    assert info.value.why == ("plain words " * 40)[:200]
    assert error_text(b'{"error": "why"}') == "why" and error_text(b"[1]") == "[1]"


async def test_the_bearer_token_is_sent_with_every_call(base: str) -> None:
    async with ApiClient(TOKEN) as client:
        got = (await client.get(base, "/echo", params={"a": "1"})).json()
        posted = (await client.request("POST", base, "/echo", body={"x": 1})).json()
    assert got == {"method": "GET", "authorization": f"Bearer {TOKEN}", "query": {"a": "1"},
                   "body": None}
    assert posted["method"] == "POST" and posted["body"] == {"x": 1}
    assert posted["authorization"] == f"Bearer {TOKEN}"
    async with ApiClient() as anonymous:
        assert (await anonymous.get(base, "/echo")).json()["authorization"] is None


async def test_no_answer_in_time_is_a_timeout(base: str) -> None:
    async with ApiClient(timeout=30.0) as client:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ApiTimeout) as info:
            await client.get(base, "/slow", timeout=0.2, who=WHO)
        assert asyncio.get_running_loop().time() - started < 3
    assert str(info.value) == f"{WHO} at {base} does not answer (TimeoutError)"
    assert isinstance(info.value, ApiUnreachable)
    assert cli_error(info.value).code == EXIT_UNAVAILABLE
    async with ApiClient(timeout=0.2) as client:  # the client's own timeout
        with pytest.raises(ApiTimeout):
            await client.get(base, "/slow")


async def test_nothing_listening_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with ApiClient() as client:
        with pytest.raises(ApiUnreachable) as info:
            await client.get(url, "/healthz", who=WHO)
    assert str(info.value).startswith(f"{WHO} at {url} does not answer (ClientConnectorError")
    assert not isinstance(info.value, ApiTimeout)
    error = cli_error(info.value)
    assert error.code == EXIT_UNAVAILABLE and str(error) == str(info.value)


async def test_an_unreadable_answer_is_unavailable(base: str) -> None:
    async with ApiClient() as client:
        answer = await client.get(base, "/not-json", who=WHO)
    with pytest.raises(ApiBadAnswer) as info:
        answer.json("listing")
    assert str(info.value).startswith(f"{WHO} sent an unreadable listing (")
    assert isinstance(info.value, ApiUnavailable)
    assert cli_error(info.value).code == EXIT_UNAVAILABLE


async def test_the_server_is_named_by_its_url_by_default(base: str) -> None:
    async with ApiClient() as client:
        answer = await client.get(base, "/status/500")
    with pytest.raises(ApiStatusError, match=f"^{base} answered 500: no: 500$"):
        answer.raise_for_status()


async def test_a_client_outside_async_with_refuses(base: str) -> None:
    client = ApiClient()
    with pytest.raises(RuntimeError, match="async with"):
        await client.get(base, "/echo")


def make_cert(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True,
                   timeout=30)
    return str(cert), str(key)


async def test_tls_with_the_ca_and_without(tmp_path: Path) -> None:
    """The client side of ``server_tls``: the CA given, https works; the system CAs do not
    know the certificate: unreachable (exit 3), as a server that does not answer."""
    cert, key = make_cert(tmp_path)
    server = TestServer(app(), host="127.0.0.1")
    await server.start_server(ssl=server_tls(cert, key))
    try:
        base = f"https://127.0.0.1:{server.port}"
        async with ApiClient(TOKEN, client_tls(cert)) as client:
            assert client.scheme == "https"
            answer = await client.get(base, "/echo")
            assert answer.json()["authorization"] == f"Bearer {TOKEN}"
        async with ApiClient() as untrusting:
            assert untrusting.scheme == "http"
            with pytest.raises(ApiUnreachable, match="CertificateError"):
                await untrusting.get(base, "/echo")
    finally:
        await server.close()


def test_load_access(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(f"  {TOKEN}\n")
    token.chmod(0o600)
    cert, _ = make_cert(tmp_path)
    got, tls = load_access(str(token), "--api-token-file", cert, "--api-ca")
    assert got == TOKEN and tls is not None
    assert load_access(None, "--api-token-file", None, "--api-ca") == (None, None)


@pytest.mark.parametrize(("given", "message"), [
    ("missing-token", "--api-token-file: cannot read"),
    ("open-token", "--api-token-file: {path} is readable by every user; chmod 600 it"),
    ("bad-ca", "--api-ca: cannot load {path}: "),
])
def test_what_cannot_be_loaded_is_bad_input(tmp_path: Path, given: str, message: str) -> None:
    path = tmp_path / given
    if given == "open-token":
        path.write_text(TOKEN)
        path.chmod(0o644)
    if given == "bad-ca":
        path.write_text("not a certificate")
    token, ca = (None, str(path)) if given == "bad-ca" else (str(path), None)
    with pytest.raises(ApiSetupError) as info:
        load_access(token, "--api-token-file", ca, "--api-ca")
    error = cli_error(info.value)
    assert error.code == EXIT_USAGE and str(error).startswith(message.format(path=path))


def test_every_error_kind_has_one_exit_code() -> None:
    table: list[tuple[ApiError, int]] = [
        (ApiUnavailable("n has no API address"), EXIT_UNAVAILABLE),
        (ApiUnreachable(WHO, "http://x:1", "OSError"), EXIT_UNAVAILABLE),
        (ApiTimeout(WHO, "http://x:1", "TimeoutError"), EXIT_UNAVAILABLE),
        (ApiBadAnswer(WHO, "answer", "bad"), EXIT_UNAVAILABLE),
        (ApiRefused(WHO, 401, "wrong bearer token"), EXIT_REFUSED),
        (ApiForbidden(WHO, 403, 'token of team "b" may not drain node n1'), EXIT_REFUSED),
        (ApiStatusError(WHO, 500, "boom"), 1),
        (ApiSetupError("--api-ca: cannot load x"), EXIT_USAGE),
        (ApiError("anything else"), 1),
    ]
    for exc, code in table:
        assert cli_error(exc).code == code, exc
    refused = cli_error(ApiRefused(WHO, 401, "wrong"), token_flag="--token-file")
    assert str(refused) == f"{WHO} refused: wrong (give the token with --token-file)"
