"""The exception types loopbridge raises on its own behalf.

Each names ``loopbridge`` as its module in its class body, not only when
``loopbridge`` exports it (:mod:`loopbridge._public`): ``UnsupportedRuntime``
is raised while ``loopbridge`` itself is still being imported, and its
traceback must say ``loopbridge.UnsupportedRuntime`` too.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "Advice",
    "Fix",
    "LoopAffinityError",
    "OwnerLoopClosed",
    "UnsupportedRuntime",
    "refuse",
    "gone",
    "uses",
    "code_name",
    "owner_closed",
    "fork_advice",
]


class Fix:
    """One way out of a refusal, as one line of code.

    ``kind`` says how ``code`` is used: ``"declare"``, a keyword argument to add
    to ``where`` (``adopt(...)``, ``@loop_affine(...)`` or an ``Owned(...)``
    rule); ``"undeclare"``, one to take out of ``where``; ``"loop"``, an
    expression to use instead on an asyncio loop or in trio (awaited, iterated
    with ``async for`` or entered with ``async with``); ``"thread"``, the same
    from a plain thread; ``"owner"``, code to run on the owner loop; ``"run"``,
    a statement to run first, from any thread; ``"child"``, a statement for a
    forked worker process, where ``when`` names the hook that runs it there.
    ``target`` is the name ``code`` gives the object (``p``: the proxy, or the
    pending result, the refused use was made through); ``(...)`` in ``code``
    stands for the refused call's own arguments.  ``say``, when given, is the
    text before the code in place of the kind's own.
    """

    __slots__ = ("kind", "code", "where", "when", "target", "say")

    def __init__(
        self,
        kind: str,
        code: str,
        where: str = "",
        when: str = "",
        target: str = "obj",
        say: str = "",
    ) -> None:
        self.kind = kind
        self.code = code
        self.where = where
        self.when = when
        self.target = target
        self.say = say

    def sentence(self) -> str:
        if self.say:
            how = f"{self.say} `{self.code}`"
        else:
            how = {
                "declare": f"declare `{self.code}` in {self.where}",
                "undeclare": f"remove `{self.code}` from {self.where}",
                "loop": f"on a loop use `{self.code}`",
                "thread": f"from a plain thread use `{self.code}`",
                "owner": f"on its owner loop use `{self.code}`",
                "run": f"first run `{self.code}`",
                "child": f"in the worker process, after the fork, run `{self.code}`",
            }[self.kind]
        return f"{how} {self.when}" if self.when else how

    def __repr__(self) -> str:
        return f"Fix({self.kind!r}, {self.code!r})"


class Advice:
    """What a refusal says, as data: the message is rendered from it, so the
    code a user reads is the code a program can take from ``exc.advice``.

    ``problem`` names the user's member; the first sentence is the problem and
    every fix, each with its code between backquotes; ``why`` follows.
    """

    __slots__ = ("problem", "fixes", "why")

    def __init__(self, problem: str, fixes: Sequence[Fix], why: str = "") -> None:
        self.problem = problem
        self.fixes = tuple(fixes)
        self.why = why

    def render(self) -> str:
        first = f"{self.problem}: {'; or '.join(f.sentence() for f in self.fixes)}."
        return f"{first} {self.why}" if self.why else first

    def __repr__(self) -> str:
        return f"Advice({self.problem!r}, {self.fixes!r})"


class LoopAffinityError(RuntimeError):
    """An object that belongs to one event loop was used in a way that is unsafe.

    Raised for misuse that would otherwise corrupt the owner's state or deadlock:
    calling a loop-affine object's async member from a loop that does not own it,
    touching a sync member that was not declared stable or thread-safe through a
    proxy, or using the blocking face on the owner loop's own thread.  The message
    always says what to do instead; ``advice`` (an :class:`Advice`, or ``None``)
    gives it as code.
    """

    __module__ = "loopbridge"
    advice: Advice | None = None


class OwnerLoopClosed(RuntimeError):
    """The loop that owns the object stopped or closed.

    Every call and stream still waiting on that loop fails with this error, and
    new calls fail at once.  Transfer the object to a running loop with
    :func:`loopbridge.transfer` to use it again.
    """

    __module__ = "loopbridge"
    advice: Advice | None = None


class UnsupportedRuntime(RuntimeError):
    """This Python or event loop lacks something loopbridge's guarantees rest on.

    Raised at import (a process-wide fact, such as a missing CPython internal) or when
    loopbridge first talks to a loop (a per-loop fact), never as a silent
    fallback.  The message names what is missing and why it is needed.
    """

    __module__ = "loopbridge"


def refuse(advice: Advice) -> LoopAffinityError:
    """The :class:`LoopAffinityError` whose message is ``advice``, rendered."""
    err = LoopAffinityError(advice.render())
    err.advice = advice
    return err


def gone(advice: Advice) -> OwnerLoopClosed:
    """The :class:`OwnerLoopClosed` whose message is ``advice``, rendered."""
    err = OwnerLoopClosed(advice.render())
    err.advice = advice
    return err


#: How a description names a protocol step of an object (``_faces``, ``_pending``).
_STEP_PREFIXES = ("entering ", "awaiting ", "iterating ")


def code_name(cls_name: str) -> str:
    """The name advice code gives an instance of ``cls_name`` (``response``)."""
    base = cls_name.rsplit(".", 1)[-1].lstrip("_") or "obj"
    out = "".join(f"_{c.lower()}" if c.isupper() else c for c in base).lstrip("_")
    return out if out.isidentifier() else "obj"


def uses(description: str, target: str = "p") -> tuple[str, str]:
    """What does the work ``description`` names through the proxy ``target``: the
    code on a loop (awaited, entered or iterated) and from a plain thread.

    ``"Engine.generate()"`` gives ``p.generate(...)`` and
    ``loopbridge.blocking(p).generate(...)``; a protocol step (``"entering
    Client.stream()"``, ``"awaiting a Job object"``) the object itself, and
    from a thread its blocking face (``.result()`` to wait for an awaitable).
    """
    head = description.split(", ", 1)[0]  # "X.m(), made by the work of Y.n()"
    face = f"loopbridge.blocking({target})"
    if head.startswith("awaiting "):
        return target, f"{face}.result()"
    if head.startswith(_STEP_PREFIXES):
        return target, face
    member = head.removesuffix("()").rsplit(".", 1)[-1]
    if not member.isidentifier() or member.startswith("__"):  # the object's own protocol
        return target, face
    return f"{target}.{member}(...)", f"{face}.{member}(...)"


#: What a caller whose owner loop is gone can do (unless the reason says already).
_CLOSED_FIX = (
    "keep the loop running while its objects are in use, or move the object to a "
    "running loop with loopbridge.transfer(obj, loop)"
)


def owner_closed(what: str, reason: BaseException, starting: bool = False) -> OwnerLoopClosed:
    """The error of the operation ``what`` (``"Engine.generate()"``) whose owner loop
    is gone: ``reason`` says which loop and how (its ``LoopThread``'s name leads its
    label).  ``starting``: it was refused before it started."""
    text = str(reason)
    how = "cannot start" if starting else "cannot complete"
    fixed = "loopbridge.transfer" in text or "fork()" in text  # the reason has a fix
    return OwnerLoopClosed(f"{what} {how}: {text}" + ("" if fixed else f"; {_CLOSED_FIX}"))


def fork_advice(label: str, thread: str | None) -> Advice:
    """What a call to a loop whose thread did not survive a fork says: make the
    ``LoopThread``, and what it owns, in the worker process (each server's hook)."""
    on = f" (thread {thread!r})" if thread else ""
    return Advice(
        f"{label}{on} did not survive fork()",
        [
            Fix(
                "child",
                "loopbridge.LoopThread().start()",
                when="with the objects it owns, in gunicorn's post_fork hook, Celery's "
                "worker_process_init signal, uWSGI's @postfork or the function a "
                "multiprocessing worker runs",
                target="loop_thread",
            )
        ],
        "The loop's thread exists only in the parent process.",
    )
