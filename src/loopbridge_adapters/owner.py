"""Declaring the loop that owns an engine, and its member table, once per engine.

An engine (vLLM's ``AsyncLLM``, SGLang's ``TokenizerManager``) starts its handler (the
output handler, ``handle_loop``) on the loop of its first request, and cannot move
once it has. An adapter describes its engine once in an :class:`Adoption`: where the
handler runs, the member table's declarations, the words its errors use. Then
:meth:`Adoption.adopt` is the adapter's ``adopt_engine``/``adopt_manager`` and
:meth:`Adoption.bind_owner_loop` its ``bind_owner_loop``, which lets a framework name
the owner loop early (a Ray actor's ``post_init``).

Invariants:

* an engine is declared loop-affine once, with the adapter's member table; declaring
  it again is a no-op for the same loop and an error for another one, and an engine
  declared by ``loopbridge.adopt`` without the table is refused (its proxies would
  forward members no rule covers);
* an owner loop is never named against the loop the handler already runs on.

Built on the core's public API only; imports no engine and no adapter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from loopbridge import LoopAffinityError, adopt, owner_loop, transfer, unwrap

__all__ = ["Adoption"]

_E = TypeVar("_E")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@dataclasses.dataclass(frozen=True, eq=False)
class Adoption:
    """How one adapter declares its engine; see the module docstring.

    ``noun`` is what messages call the engine ("engine", "manager"), ``handler`` its
    handler ("output handler", "handle_loop"), ``moving`` the refusal's reason ("an
    AsyncLLM cannot change loops once it has started") and ``declarers`` the calls
    that declare it with the table ("adopt_engine()/engine_client_proxy()").
    ``handler_loop`` tells where the handler runs, if it has started;
    ``declarations`` is the member table's ``(stable, threadsafe)`` for an engine
    (failing closed); ``prepare`` runs on the engine just before it is declared.
    """

    noun: str
    handler: str
    moving: str
    declarers: str
    handler_loop: Callable[[Any], asyncio.AbstractEventLoop | None]
    declarations: Callable[[Any], tuple[frozenset[str], frozenset[str]]]
    prepare: Callable[[Any], None] = lambda engine: None
    # The engines declared here (with the member table).
    _adopted: weakref.WeakSet[Any] = dataclasses.field(default_factory=weakref.WeakSet)

    @property
    def started_elsewhere(self) -> str:
        """The refusal of a loop other than the one the handler runs on."""
        return f"the {self.noun}'s {self.handler} already runs on another loop; {self.moving}"

    def adopt(self, engine: _E, loop: asyncio.AbstractEventLoop | None = None) -> _E:
        """Declare ``engine``'s owner loop and member table (once per engine).

        ``loop`` defaults to the loop the handler already runs on, else the running
        loop; with neither, the engine has no owner until :meth:`bind_owner_loop`.
        Again for an engine already declared: a no-op (same loop) or an error.
        """
        running = self.handler_loop(engine)
        if loop is not None and running is not None and loop is not running:
            raise LoopAffinityError(self.started_elsewhere)
        target = loop or running
        try:
            current = owner_loop(engine)
        except LoopAffinityError:
            pass
        else:
            self._adopted_again(engine, target, current)
            return engine
        stable, threadsafe = self.declarations(engine)
        if target is None:
            target = _running_loop()
        self.prepare(engine)
        adopt(engine, loop=target, stable=stable, threadsafe=threadsafe)
        self._adopted.add(engine)
        return engine

    def _adopted_again(
        self,
        engine: Any,
        target: asyncio.AbstractEventLoop | None,
        current: asyncio.AbstractEventLoop | None,
    ) -> None:
        if engine not in self._adopted:
            raise LoopAffinityError(
                f"the {self.noun} was declared loop-affine elsewhere (loopbridge.adopt) "
                f"without this module's member table; let {self.declarers} declare it instead"
            )
        if target is not None and current is not None and target is not current:
            raise LoopAffinityError(f"the {self.noun} is already declared for another loop")
        if target is not None and current is None:
            transfer(engine, target)

    def bind_owner_loop(self, engine: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        """Make ``loop`` (default: the running one) the owner of ``engine`` (or of the
        engine a proxy stands for), whose handler must not run on another loop yet."""
        engine = unwrap(engine)
        target = loop or _running_loop()
        if target is None:
            raise LoopAffinityError(
                "bind_owner_loop() needs a loop: pass one or call it on the owner loop"
            )
        running = self.handler_loop(engine)
        if running is not None and running is not target:
            raise LoopAffinityError(self.started_elsewhere)
        self.adopt(engine)
        transfer(engine, target)
