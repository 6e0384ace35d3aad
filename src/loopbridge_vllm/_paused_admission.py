"""What the threaded server does with a request that arrives while generation is paused.

vLLM's own answer depends on the release and the pause mode (measured on each
tested release by tests/vllm/test_paused_admission.py; the table is in docs/vllm.md):
from 0.33, ``"abort"`` and ``"wait"`` refuse a new request (503; a streamed one gets
200 and then an error event) and ``"keep"`` queues it in the engine; up to 0.32
every mode queues it in the engine until the resume. The server's
``paused_admission`` makes the choice explicit:

* ``"engine"`` (the default): the release's own answer, unchanged.
* ``"refuse"``: 503 with ``Retry-After`` before the request reaches the engine,
  streamed or not, in every mode and on every release.
* ``"hold"``: the request waits in the server, not in the engine, until the resume,
  then goes in; after ``paused_hold_s`` seconds without a resume it gets the 503.
  A client that leaves while held leaves nothing in the engine.

*Paused* means: from the moment a pause call reaches the engine's client object
(``AsyncLLM.engine_core``'s ``pause_scheduler_async``, or ``pause_generation_async``
where the release has it), whoever made it (the trainer on the owner loop, a
proxy, a Ray method), until its ``resume_scheduler_async`` returns. :class:`PauseWatch`
wraps those members on that one object; :meth:`PauseWatch.close` puts them back.

Invariants:

* A request is gated once, when it arrives. One admitted before the pause began is
  in flight: the engine handles it by the pause mode.
* Only generation routes are gated (:data:`GENERATION_PATHS` present in the app):
  control routes pass, so a held request never blocks the call that would release it.
* A held request ends in exactly one of: admitted (resume), refused (its bound,
  or the watch closed while the server stops), or dropped (its client left). The
  body it sent is replayed to the app unchanged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import functools
import json
import threading
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

__all__ = [
    "GENERATION_PATHS",
    "PausePolicy",
    "PauseWatch",
    "PausedAdmission",
    "gate_paused",
    "pause_policy",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

#: The routes that hand a request to the engine, on any tested release (a route a
#: release lacks is skipped; /v1/completions and /v1/chat/completions must exist).
GENERATION_PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/chat/completions/batch",
    "/v1/responses",
    "/v1/messages",
    "/inference/v1/generate",
    "/invocations",
    "/generative_scoring",
)
_REQUIRED_PATHS = ("/v1/completions", "/v1/chat/completions")
_PAUSE_MEMBERS = ("pause_scheduler_async", "pause_generation_async")
_RESUME_MEMBER = "resume_scheduler_async"


class PausePolicy(str, enum.Enum):
    """The server's answer to a generation request that arrives while paused."""

    ENGINE = "engine"
    REFUSE = "refuse"
    HOLD = "hold"


class PauseWatch:
    """Whether the engine is paused, read from its own client's pause and resume calls.

    Built and closed on any thread: it only replaces attributes of the engine's
    client object; the wrappers run wherever the engine's calls run (its owner loop).
    """

    def __init__(self, engine: Any) -> None:
        core = getattr(engine, "engine_core", None)
        pauses = [name for name in _PAUSE_MEMBERS if hasattr(core, name)]
        if core is None or not pauses or not hasattr(core, _RESUME_MEMBER):
            raise TypeError(
                f"paused_admission needs the engine's client (engine_core) with "
                f"{' or '.join(_PAUSE_MEMBERS)} and {_RESUME_MEMBER}; "
                f"{type(engine).__name__} has none: start the server with "
                "paused_admission='engine'"
            )
        self._core = core
        self._lock = threading.Lock()
        self._held_changed = threading.Condition(self._lock)
        self._paused = False
        self._waiters: list[concurrent.futures.Future[bool]] = []
        self._installed: dict[str, Any] = {}
        for name in pauses:
            self._install(name, self._pausing(getattr(core, name)))
        self._install(_RESUME_MEMBER, self._resuming(getattr(core, _RESUME_MEMBER)))

    @property
    def paused(self) -> bool:
        return self._paused

    def _install(self, name: str, wrapper: Any) -> None:
        setattr(self._core, name, wrapper)
        self._installed[name] = wrapper

    def _pausing(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(original)
        async def pause(*args: Any, **kwargs: Any) -> Any:
            self._set(True)  # before the engine pauses: no arrival slips past
            try:
                return await original(*args, **kwargs)
            except BaseException:
                self._set(await self._engine_says_paused())
                raise

        return pause

    def _resuming(self, original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(original)
        async def resume(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            self._set(False)  # after the engine resumed: a released request runs
            return result

        return resume

    async def _engine_says_paused(self) -> bool:
        try:
            return bool(await self._core.is_scheduler_paused_async())
        except Exception:  # the engine cannot say: stay paused until a resume
            return True

    def _set(self, paused: bool, *, released: bool = True) -> None:
        with self._lock:
            self._paused = paused
            waiters, self._waiters = (self._waiters, []) if not paused else ([], self._waiters)
            self._held_changed.notify_all()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(released)

    async def resumed(self, timeout: float) -> bool:
        """Wait (on any loop) until the resume; False if ``timeout`` passed or the
        watch closed first."""
        waiter: concurrent.futures.Future[bool] = concurrent.futures.Future()
        with self._lock:
            if not self._paused:
                return True
            self._waiters.append(waiter)
            self._held_changed.notify_all()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(waiter), timeout)
        except asyncio.TimeoutError:
            return False
        finally:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                    self._held_changed.notify_all()

    @property
    def held(self) -> int:
        """How many requests wait for the resume now."""
        with self._lock:
            return len(self._waiters)

    def wait_held(self, count: int, timeout: float) -> bool:
        """Block this thread until exactly ``count`` requests are held; False if
        ``timeout`` passed first. For tests and drains: no polling."""
        with self._held_changed:
            return self._held_changed.wait_for(lambda: len(self._waiters) == count, timeout)

    def close(self) -> None:
        """Put the engine's members back and refuse whatever still waits."""
        for name, wrapper in self._installed.items():
            if self._core.__dict__.get(name) is wrapper:
                delattr(self._core, name)
        self._installed.clear()
        self._set(False, released=False)


class PausedAdmission:
    """ASGI middleware: generation requests that arrive while paused, by :class:`PausePolicy`."""

    def __init__(
        self,
        app: ASGIApp,
        watch: PauseWatch,
        policy: PausePolicy,
        hold_s: float,
        routes: Iterable[str],
    ) -> None:
        present = set(routes)
        missing = [path for path in _REQUIRED_PATHS if path not in present]
        if missing:
            raise TypeError(
                f"paused_admission={policy.value!r} gates the generation routes, and this "
                f"vLLM app lacks {', '.join(missing)}: start the server with "
                "paused_admission='engine'"
            )
        self.app = app
        self._watch = watch
        self._policy = policy
        self._hold_s = hold_s
        self._gated = frozenset(path for path in GENERATION_PATHS if path in present)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        gated = (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope.get("path") in self._gated
            and self._watch.paused
        )
        if not gated:
            await self.app(scope, receive, send)
        elif self._policy is PausePolicy.REFUSE:
            await _refuse(send, "generation is paused; retry after it resumes")
        else:
            await self._hold(scope, receive, send)

    async def _hold(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        body: list[Message] = []
        while True:  # the whole body first (the server's body limit bounds it)
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before it finished sending
            body.append(message)
            if not message.get("more_body", False):
                break
        left = asyncio.ensure_future(receive())  # completes only when the client leaves
        resumed = asyncio.ensure_future(self._watch.resumed(self._hold_s))
        await asyncio.wait((left, resumed), return_when=asyncio.FIRST_COMPLETED)
        if not resumed.done():
            resumed.cancel()
            return  # the client left while held: nothing reached the engine
        if not resumed.result():
            left.cancel()
            await _refuse(send, f"generation stayed paused for {self._hold_s:g} s; retry later")
            return

        waiting = [left]  # the receive already made: its message goes to the app

        async def replay() -> Message:
            if body:
                return body.pop(0)
            if waiting:
                return await waiting.pop()
            return await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Send, message: str) -> None:
    payload = {
        "error": {
            "message": message,
            "type": "ServiceUnavailableError",
            "param": None,
            "code": 503,
        }
    }
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


def gate_paused(
    app: ASGIApp, engine: Any, policy: PausePolicy, hold_s: float, routes: Iterable[str]
) -> tuple[ASGIApp, PauseWatch | None]:
    """``app`` behind the policy's gate, and the watch the server closes when it stops
    (none for :attr:`PausePolicy.ENGINE`, which changes nothing)."""
    if policy is PausePolicy.ENGINE:
        return app, None
    watch = PauseWatch(engine)
    try:
        return PausedAdmission(app, watch, policy, hold_s, routes), watch
    except BaseException:
        watch.close()
        raise


def pause_policy(value: str | PausePolicy) -> PausePolicy:
    """The policy named ``value``, or a ValueError naming the choices."""
    try:
        return PausePolicy(value)
    except ValueError:
        choices = ", ".join(repr(p.value) for p in PausePolicy)
        raise ValueError(f"paused_admission must be one of {choices}, not {value!r}") from None
