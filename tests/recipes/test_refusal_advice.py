"""Every refusal's advice is executable, on the real clients of docs/recipes.md.

Each test starts from a client declared with less than it needs, uses it as a
user would (from another asyncio loop, from trio and from a plain thread), and
whenever loopbridge refuses, takes the fix from the *message text* (the code
between backquotes in its first sentence), checks it is the code of the
exception's ``advice``, applies it literally, and tries again.  The test passes
only if the advice converges: the use then works, the client's I/O ran on the
owner loop's thread (recorded by the client's own hooks), and the sanitizer,
raising (see conftest.py), saw nothing off-owner.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

import loopbridge as lb
from loopbridge import LoopAffinityError, Owned

from .conftest import GrpcServer, HttpServer, run_in

CODE = re.compile(r"`([^`]+)`")
ROOT = "@loop_affine(...) or adopt(...)"
RULE = re.compile(
    r"^the Owned\(\.\.\.\) rule that gives the (?P<cls>[\w.]+) object from (?P<what>.+)$"
)
STEPS = {"entering ": "__aenter__", "awaiting ": "__await__", "iterating ": "__anext__"}
CALLERS = ["asyncio", "trio", "thread"]


# ------------------------------------------------------------ reading advice
def fixes_of(exc: BaseException) -> list[tuple[Any, str]]:
    """The fixes of a refusal, each with its code as the message shows it."""
    advice = getattr(exc, "advice", None)
    assert advice is not None, f"a refusal without advice: {exc}"
    text = str(exc)
    assert text == advice.render()
    first = text.split(". ", 1)[0]
    codes = CODE.findall(first)
    assert codes == [f.code for f in advice.fixes], text
    assert len(first) <= 400, f"the first sentence is a paragraph: {first}"
    return list(zip(advice.fixes, codes, strict=True))


def keywords(code: str) -> dict[str, Any]:
    """A declaration's code (``returns={...}``) as keyword arguments."""
    value = eval(f"dict({code})", {"loopbridge": lb})
    assert isinstance(value, dict)
    return value


def _path(what: str, known: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """``('stream', '__aenter__')`` for ``entering AsyncClient.stream()``."""
    for prefix, step in STEPS.items():
        if what.startswith(prefix):
            owner, member = what[len(prefix) :].removesuffix("()").rsplit(".", 1)
            return (*known.get(owner, ()), member, step)
    owner, member = what.removesuffix("()").rsplit(".", 1)
    return (*known.get(owner, ()), member)


def _with(rule: Owned, path: tuple[str, ...], kw: dict[str, Any]) -> Owned:
    """``rule`` with ``kw`` declared on the result at ``path`` below it."""
    stable, threadsafe, returns = set(rule.stable), set(rule.threadsafe), dict(rule.returns)
    if path:
        returns[path[0]] = _with(returns.get(path[0], Owned()), path[1:], kw)
    else:
        stable |= set(kw.get("stable", ()))
        threadsafe |= set(kw.get("threadsafe", ()))
        returns.update(kw.get("returns", {}))
    return Owned(stable=stable, threadsafe=threadsafe, returns=returns)


@dataclass
class Declarations:
    """What a user has declared for the root object so far, built only from advice."""

    rule: Owned = field(default_factory=Owned)
    known: dict[str, tuple[str, ...]] = field(default_factory=dict)  # class -> path
    met: list[str] = field(default_factory=list)

    def kwargs(self) -> dict[str, Any]:
        r = self.rule
        return {"stable": r.stable, "threadsafe": r.threadsafe, "returns": dict(r.returns)}

    def apply(self, exc: LoopAffinityError) -> None:
        self.met.append(str(exc))
        fix, code = fixes_of(exc)[0]
        assert fix.kind == "declare", f"not a declaration to apply here: {exc}"
        kw = keywords(code)
        if fix.where == ROOT:
            self.rule = _with(self.rule, (), kw)
            return
        m = RULE.match(fix.where)
        assert m is not None, fix.where
        path = _path(m["what"], self.known)
        self.known[m["cls"].rsplit(".", 1)[-1]] = path
        self.rule = _with(self.rule, path, kw)


# ------------------------------------------------------------ where I/O runs
class Where:
    """The threads a client's I/O ran on."""

    def __init__(self) -> None:
        self.threads: set[int] = set()

    def note(self) -> None:
        self.threads.add(threading.get_ident())


def owner_ident(owner: lb.LoopThread) -> int:
    async def ident() -> int:
        return threading.get_ident()

    return owner.run(ident)


def follow(
    owner: lb.LoopThread,
    make: Callable[[Declarations, Where], Any],
    use_async: Callable[[Any], Awaitable[object]],
    use_thread: Callable[[Any], object],
    close: Callable[[Any], None],
    steps: int = 6,
) -> Declarations:
    """Use the client from each caller; on a refusal, apply its advice and start over."""
    decl = Declarations()
    for _ in range(steps):
        where = Where()
        client = make(decl, where)
        try:
            for caller in CALLERS:
                if caller == "thread":
                    use_thread(client)
                else:
                    run_in(caller, use_async, client)
        except LoopAffinityError as exc:
            decl.apply(exc)
            continue
        except BaseException as exc:
            exc.add_note("advice followed so far:\n" + "\n".join(decl.met))
            raise
        finally:
            close(client)
        assert where.threads == {owner_ident(owner)}, "the client's I/O ran off its owner"
        return decl
    raise AssertionError("the advice did not converge:\n" + "\n".join(decl.met))


@pytest.fixture
def owner() -> Iterator[lb.LoopThread]:
    with lb.LoopThread(name="advice-owner") as t:
        yield t


# ----------------------------------------------------------------------- httpx
def _recording_transport(where: Where) -> Any:
    import httpx

    class Stream(httpx.AsyncByteStream):
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __aiter__(self) -> Any:
            async for chunk in self.inner:
                where.note()
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class Transport(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: Any) -> Any:
            where.note()
            response = await super().handle_async_request(request)
            response.stream = Stream(response.stream)
            return response

    return Transport()


def _httpx_client(owner: lb.LoopThread) -> Callable[[Declarations, Where], Any]:
    httpx = pytest.importorskip(
        "httpx", reason="httpx is not installed (dependency group: recipes)"
    )

    def make(decl: Declarations, where: Where) -> Any:
        async def build() -> Any:
            client = httpx.AsyncClient(transport=_recording_transport(where))
            return lb.adopt(client, **decl.kwargs())

        return lb.proxy(owner.run(build))

    return make


def _close(client: Any) -> None:
    lb.blocking(client).aclose()


def test_httpx_streamed_response(owner: lb.LoopThread, http_server: HttpServer) -> None:
    """issue: ``client.stream()`` advises ``returns={'stream': Owned()}``; followed
    literally, the streamed response is read on the owner, from every caller."""
    url = f"{http_server.url}/lines/3"
    want = ["line 0", "line 1", "line 2"]

    async def use(client: Any) -> None:
        async with client.stream("GET", url) as r:
            assert [line async for line in r.aiter_lines()] == want
            assert r.num_bytes_downloaded == 21

    def use_thread(client: Any) -> None:
        with lb.blocking(client.stream("GET", url)) as r:
            assert list(lb.blocking(r).aiter_lines()) == want
            assert r.num_bytes_downloaded == 21

    decl = follow(owner, _httpx_client(owner), use, use_thread, _close)
    assert decl.met[0].startswith("AsyncClient.stream() is refused through a proxy: declare ")


@pytest.mark.parametrize("caller", CALLERS)
def test_httpx_iter_lines_advises_its_async_twin(
    owner: lb.LoopThread, http_server: HttpServer, caller: str
) -> None:
    """issue: ``response.iter_lines()`` advised returns=/stable=/threadsafe=; its
    advice is now ``aiter_lines()``, on a loop or through ``blocking``, and it runs."""
    recipe = pytest.importorskip("recipes.recipe").load_recipe("httpx")
    where = Where()
    client = recipe.open_client(owner, transport=_recording_transport(where))
    url = f"{http_server.url}/lines/3"
    want = ["line 0", "line 1", "line 2"]

    def advised(response: Any) -> tuple[Any, str]:
        with pytest.raises(LoopAffinityError) as info:
            response.iter_lines()
        fixes = {fix.kind: (fix, code) for fix, code in fixes_of(info.value)}
        assert str(info.value).startswith("Response.iter_lines() is refused through a proxy: ")
        fix, code = fixes["thread" if caller == "thread" else "loop"]
        return eval(code, {"loopbridge": lb, fix.target: response}), code

    async def on_loop() -> None:
        async with client.stream("GET", url) as response:
            lines, code = advised(response)
            assert code == "response.aiter_lines()"
            assert [line async for line in lines] == want

    try:
        if caller == "thread":
            with lb.blocking(client.stream("GET", url)) as response:
                lines, code = advised(response)
                assert code == "loopbridge.blocking(response).aiter_lines()"
                assert list(lines) == want
        else:
            run_in(caller, on_loop)
    finally:
        recipe.close_client(client)
    assert where.threads == {owner_ident(owner)}


# --------------------------------------------------------------------- aiohttp
def test_aiohttp_streamed_response(owner: lb.LoopThread, http_server: HttpServer) -> None:
    """From a bare ``adopt(session)``, the advice alone leads to a session whose
    requests, responses and body streams run on the owner, from every caller."""
    aiohttp = pytest.importorskip(
        "aiohttp", reason="aiohttp is not installed (dependency group: recipes)"
    )
    url = f"{http_server.url}/lines/3"
    want = [b"line 0\n", b"line 1\n", b"line 2\n"]

    def make(decl: Declarations, where: Where) -> Any:
        async def build() -> Any:
            trace = aiohttp.TraceConfig()

            async def noted(*args: object) -> None:
                where.note()

            trace.on_request_start.append(noted)
            trace.on_response_chunk_received.append(noted)
            session = aiohttp.ClientSession(trace_configs=[trace])
            return lb.adopt(session, **decl.kwargs())

        return lb.proxy(owner.run(build))

    async def use(session: Any) -> None:
        async with session.get(url) as response:
            assert response.ok
            assert [line async for line in response.content] == want

    def use_thread(session: Any) -> None:
        with lb.blocking(session.get(url)) as response:
            assert response.ok
            assert list(lb.blocking(response.content)) == want

    decl = follow(owner, make, use, use_thread, lambda s: lb.blocking(s).close())
    assert decl.met[0].startswith("ClientSession.get() is refused through a proxy: declare ")


# ------------------------------------------------------------------------ gRPC
def test_grpc_stream(owner: lb.LoopThread, grpc_server: GrpcServer) -> None:
    """A stub adopted bare: the advice leads to server streams read on the owner."""
    grpc = pytest.importorskip("grpc", reason="grpcio is not installed (dependency group: recipes)")
    recipe = pytest.importorskip("recipes.recipe").load_recipe("grpc")

    def make(decl: Declarations, where: Where) -> Any:
        class Noting(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
            async def intercept_unary_stream(self, cont: Any, details: Any, req: Any) -> Any:
                where.note()
                return await cont(details, req)

        async def build() -> Any:
            channel = grpc.aio.insecure_channel(grpc_server.target, interceptors=[Noting()])
            return channel, lb.adopt(recipe.EchoStub(channel), **decl.kwargs())

        channel, stub = owner.run(build)
        return channel, lb.proxy(stub)

    async def use(pair: Any) -> None:
        assert [m async for m in pair[1].Count(b"3")] == [b"0", b"1", b"2"]

    def use_thread(pair: Any) -> None:
        assert list(lb.blocking(pair[1]).Count(b"3")) == [b"0", b"1", b"2"]

    def close(pair: Any) -> None:
        owner.run(pair[0].close)

    decl = follow(owner, make, use, use_thread, close)
    assert decl.met[0].startswith("EchoStub.Count() (an instance attribute) is refused")
    assert "`returns={'__call__': loopbridge.Owned()}`" in decl.met[1]


# ------------------------------------------------------------------ websockets
def test_websockets_ping_and_latency(owner: lb.LoopThread) -> None:
    """``ping()`` gives a Future (uncovered: awaiting it is marshalled); ``latency``
    is data: its advice is ``stable=``, and the connection's I/O stays on the owner."""
    ws_client = pytest.importorskip(
        "websockets.asyncio.client",
        reason="websockets is not installed (dependency group: recipes)",
    )
    ws_server = pytest.importorskip(
        "websockets.asyncio.server",
        reason="websockets is not installed (dependency group: recipes)",
    )

    async def echo(conn: Any) -> None:
        async for message in conn:
            await conn.send(message)

    server = owner.run(lambda: ws_server.serve(echo, "127.0.0.1", 0).__aenter__())
    port = server.sockets[0].getsockname()[1]

    def make(decl: Declarations, where: Where) -> Any:
        async def build() -> Any:
            where.note()
            return lb.adopt(await ws_client.connect(f"ws://127.0.0.1:{port}"), **decl.kwargs())

        return lb.proxy(owner.run(build))

    async def use(ws: Any) -> None:
        waiter = await ws.ping()
        await waiter
        await ws.send("hi")
        assert await ws.recv() == "hi"
        assert ws.latency >= 0

    def use_thread(ws: Any) -> None:
        waiter = lb.blocking(ws).ping()
        lb.blocking(waiter)
        lb.blocking(ws).send("hi")
        assert lb.blocking(ws).recv() == "hi"
        assert ws.latency >= 0

    try:
        decl = follow(owner, make, use, use_thread, lambda ws: lb.blocking(ws).close())
    finally:

        async def stop() -> None:
            server.close()
            await server.wait_closed()

        owner.run(stop)
    assert decl.met == [
        "ClientConnection.latency (an instance attribute) is refused through a proxy: declare `stable=('latency',)` in "
        "@loop_affine(...) or adopt(...) if it is set once at setup. Other threads may read "
        "only data declared stable; if it changes later, read it in an async method on the "
        "owner."
    ]


# ---------------------------------------------------------- every sync member
def test_an_int_attribute_is_advised_stable_and_it_works(owner: lb.LoopThread) -> None:
    """issue: an ``int`` attribute's refusal led with ``returns=``."""

    class Counter:
        def __init__(self) -> None:
            self.limit = 3

        async def bump(self) -> int:
            return self.limit + 1

    def make(decl: Declarations) -> Any:
        async def build() -> Any:
            return lb.adopt(Counter(), **decl.kwargs())

        return lb.proxy(owner.run(build))

    decl = Declarations()
    with pytest.raises(LoopAffinityError) as info:
        make(decl).limit  # noqa: B018
    assert (
        str(info.value)
        .split(".<locals>.", 1)[1]
        .startswith(
            "Counter.limit (an instance attribute) is refused through a proxy: "
            "declare `stable=('limit',)` in @loop_affine(...) or adopt(...)"
        )
    )
    assert len(str(info.value).split(".<locals>.", 1)[1]) < 300
    decl.apply(info.value)
    assert make(decl).limit == 3
