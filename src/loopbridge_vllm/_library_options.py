"""``serve_argv`` for :func:`~loopbridge_vllm.start_openai_server`: ``serve``'s option table.

The library call takes the same ``vllm serve`` options as ``python -m loopbridge_vllm
serve`` (after ``--``), read by the installed vLLM's own parser and classified by the
same table (:mod:`loopbridge_vllm._serve_options`). Each option given is honoured
with its stock effect or refused with an error that subclasses ``ValueError``, names
the option and says what to do instead. What differs is only what a library call
cannot do, because its engine is already built:

* an engine field (``--max-model-len``, ``--dtype``, ...) is honoured only when it
  says what the engine already has; one that contradicts the engine, or whose
  value in the engine cannot be read, raises :class:`ServeArgsMismatch` (build the
  engine with it instead);
* ``--host``/``--port`` are honoured unless ``host=``/``port=``/``sock=`` say it too
  (given twice is refused, never a choice); ``--uds`` binds a Unix socket;
* ``--help`` and the positional model are refused (there is nothing to print, and
  the model is the engine's);
* an option the parser does not know, or a bad value, raises
  :class:`ServeOptionError` with vLLM's one-line reason: no library call prints
  usage or raises ``SystemExit``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

from loopbridge_vllm._serve_options import HONOURED, REFUSED, TABLE, engine_fields, option_name

__all__ = [
    "ENGINE_CHECKED",
    "Listen",
    "ServeArgsMismatch",
    "ServeOptionError",
    "engine_contradictions",
    "library_refusals",
    "quiet",
    "quiet_parse",
]


class ServeOptionError(ValueError):
    """A ``serve_argv`` option that a library call refuses, or that vLLM's parser
    rejects; the message names the option and what to do instead."""


class ServeArgsMismatch(ValueError):
    """The ``vllm serve`` namespace says something else than the engine it serves."""


#: Engine fields the server reads and checks against the engine itself
#: (``check_serve_args``): they are compared there, not here.
ENGINE_CHECKED = frozenset(
    {
        "model",
        "served_model_name",
        "enable_log_requests",
        "disable_log_stats",
        "reasoning_parser",
        "enable_fault_tolerance",
        "structured_outputs_config",
    }
)

_LIBRARY_REFUSED = {
    "help": "a library call prints no help: read `vllm serve --help`, and leave it out of "
    "serve_argv",
    "model_tag": "the model is the engine's: leave it out of serve_argv",
}


def _raise(where: str, message: str) -> NoReturn:
    raise ServeOptionError(
        f"{where}: {message.removeprefix('error: ').strip()}; see `vllm serve --help` "
        "for the options this vLLM release takes"
    )


def quiet_parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` that raises :class:`ServeOptionError` instead of
    printing usage and exiting (an unknown option, a bad value, ``--help``)."""
    if any(a in ("-h", "--help") for a in argv):
        raise ServeOptionError(f"--help: {_LIBRARY_REFUSED['help']}")
    return quiet(parser).parse_args(list(argv))


def quiet(parser: argparse.ArgumentParser, where: str = "serve_argv") -> argparse.ArgumentParser:
    """``parser``, raising :class:`ServeOptionError` (its message led by ``where``)
    where it would print usage and exit."""

    def error(message: str) -> NoReturn:
        _raise(where, message)

    def exit(status: int = 0, message: str | None = None) -> NoReturn:
        _raise(where, message or f"vLLM's parser exited with status {status}")

    # The instance's own members win over the class's (vLLM's parser subclasses
    # argparse's; its error() prints usage and exits).
    parser.error = error  # type: ignore[method-assign]
    parser.exit = exit  # type: ignore[method-assign]
    return parser


@dataclasses.dataclass(frozen=True)
class Listen:
    """What the library call was given for the address (None: not given)."""

    host: str | None
    port: int | None
    sock: bool


def library_refusals(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, given: set[str], listen: Listen
) -> list[str]:
    """One line per option in ``serve_argv`` that the library call refuses."""
    lines = [
        f"{option_name(parser, dest)}: {fix}"
        for dest, fix in _LIBRARY_REFUSED.items()
        if dest in given
    ]
    lines += TABLE.refusals(parser, ns, given)
    for flag, dest, keyword in (("--host", "host", "host="), ("--port", "port", "port=")):
        if dest in given and (getattr(listen, dest) is not None or listen.sock):
            by = "sock=" if listen.sock else keyword
            lines.append(f"{flag} is given in serve_argv and as {by}; give it once")
    if "uds" in given and (listen.host is not None or listen.port is not None or listen.sock):
        lines.append("--uds listens on a Unix socket: drop host=, port= and sock= (or drop --uds)")
    return lines


#: Where a ``vllm serve`` engine field lives in the engine's config, searched in order.
_CONFIG_PARTS = (
    "model_config",
    "cache_config",
    "parallel_config",
    "scheduler_config",
    "load_config",
    "lora_config",
    "device_config",
    "observability_config",
    "speculative_config",
    "compilation_config",
    "kv_transfer_config",
    "kv_events_config",
)

_MISSING = object()


def _engine_value(config: Any, dest: str) -> Any:
    for part in _CONFIG_PARTS:
        sub = getattr(config, part, None)
        if sub is not None and hasattr(sub, dest):
            return getattr(sub, dest)
    return getattr(config, dest, _MISSING)


def _same(given: Any, engine: Any) -> bool:
    if given == engine:
        return True
    # The command line's spelling of a value the engine holds as an object
    # (--dtype float32 is torch.float32; enums by name or value).
    shown = str(engine).removeprefix("torch.")
    for form in (shown, getattr(engine, "name", None), getattr(engine, "value", None)):
        if form is not None and str(given) == str(form):
            return True
    return False


def engine_contradictions(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, given: Iterable[str], config: Any
) -> list[str]:
    """One line per engine field in ``serve_argv`` that the engine (``config``, its
    ``vllm_config``) does not already have: a built engine cannot take it."""
    fields = engine_fields()
    skip = set(HONOURED) | set(REFUSED) | ENGINE_CHECKED
    lines = []
    for dest in sorted(set(given) & fields - skip):
        flag, value = option_name(parser, dest), getattr(ns, dest, None)
        engine = _engine_value(config, dest)
        if engine is _MISSING:
            lines.append(
                f"{flag} {value!r}: the engine's own value cannot be read, so serve_argv "
                "cannot be checked against it; build the engine with it and leave it out "
                "of serve_argv"
            )
        elif not _same(value, engine):
            lines.append(
                f"{flag} (serve_argv: {value!r}, engine: {engine!r}): the engine is built "
                "already; build it with this value, or leave it out of serve_argv"
            )
    return lines
