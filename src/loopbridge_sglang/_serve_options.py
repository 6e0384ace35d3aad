"""Every SGLang server option, honoured or refused by ``python -m loopbridge_sglang serve``.

The options come from the installed SGLang's own parser (``ServerArgs.add_cli_args``
on a fresh ``ArgumentParser``, as ``prepare_server_args`` builds it), never from a list
kept here. Each one is in exactly one of two lists:

- **honoured**: it has the effect it has with stock ``python -m sglang.launch_server``.
  A ``ServerArgs`` field is honoured through the engine (:data:`ENGINE`): the server
  arguments are built by SGLang's own ``prepare_server_args``; SGLang's own
  ``Engine._launch_subprocesses`` resolves and publishes them and starts the
  scheduler, the detokenizer and the ``TokenizerManager`` from them; SGLang's own app
  (its routes and its lifespan: metrics, tracing, tool server) reads them from the
  published configuration. A field whose effect lives in a part this server replaces
  (``launch_server``'s uvicorn set-up and API-key middleware, its warm-up, its other
  server modes) has its own rule in :data:`HONOURED` or :data:`REFUSED`.
- **refused**: a rule in :data:`REFUSED` says for which values, and what to do instead.
  ``serve`` then exits at once with status 2 and one line.

An option of the installed SGLang that no rule covers is :func:`unclassified`;
``serve`` refuses it when given, and the test suite fails on it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from loopbridge_adapters.serve_cli import OptionTable, Refusal, given_options, option_name

__all__ = [
    "ENGINE",
    "HONOURED",
    "REFUSED",
    "TABLE",
    "Refusal",
    "engine_fields",
    "given_options",
    "option_name",
    "refusals",
    "server_parser",
    "unclassified",
]

#: What honours an option that is a field of ``ServerArgs``.
ENGINE = (
    "a ServerArgs field: SGLang's prepare_server_args builds the server arguments, "
    "SGLang's Engine._launch_subprocesses starts the scheduler, detokenizer and "
    "TokenizerManager from them, and SGLang's app reads them"
)

_UVICORN = "the HTTP server's uvicorn settings, as SGLang's launch_server sets them"
_AUTH = (
    "SGLang's own API-key middleware (add_api_key_middleware), installed by this "
    "server as SGLang's launch_server installs it"
)
_GRPC_ONLY = "used by stock only with gRPC serving (--grpc-port, --smg-grpc-mode: refused)"

#: Options that are not ``ServerArgs`` fields, or fields whose effect lives in the
#: parts this server replaces: ``dest`` -> who acts on it.
HONOURED: dict[str, str] = {
    "help": "prints SGLang's option help",
    "config": "SGLang's prepare_server_args reads the YAML file into options",
    # Binding (serve binds before the engine starts: a busy port fails at once).
    "host": "the address bound (giving it before and after -- is an error)",
    "port": "the port bound (giving it before and after -- is an error)",
    # uvicorn, as SGLang's launch_server configures it.
    "fastapi_root_path": _UVICORN + " (root_path)",
    "log_level": ENGINE + "; also uvicorn's log level unless --log-level-http is given",
    "log_level_http": _UVICORN + " (log level)",
    "api_key": _AUTH,
    "admin_api_key": _AUTH,
    "uvicorn_access_log_exclude_prefixes": _UVICORN
    + " (SGLang's set_uvicorn_logging_configs filters the access log)",
    # Settings of server modes that are refused below; stock ignores them without.
    "http2_max_concurrent_streams": "used by stock only with --enable-http2 (refused)",
    "http2_initial_connection_window_size": "used by stock only with --enable-http2 (refused)",
    "enable_http_worker_reuseport": "used by stock only with --tokenizer-worker-num > 1 (refused)",
    "grpc_response_timeout_secs": _GRPC_ONLY,
    "sidecar": _GRPC_ONLY,
    "sidecar_args": _GRPC_ONLY,
    "smg_http_sidecar_port": _GRPC_ONLY,
}

_STOCK = "python -m sglang.launch_server"


def _stock(what: str) -> str:
    return f"{what}; use stock `{_STOCK}` for that"


_NO_TLS = f"this server speaks plain HTTP: terminate TLS in a proxy in front of it, or use stock `{_STOCK}`"


#: ``dest`` -> when it is refused, and what to do instead.
REFUSED: dict[str, Refusal] = {
    "tokenizer_worker_num": Refusal(
        lambda ns: ns.tokenizer_worker_num not in (None, 1),
        "this server is one TokenizerManager on one owner loop, served from one "
        f"thread: pass --tokenizer-worker-num 1, or use stock `{_STOCK}` for several "
        "tokenizer processes",
    ),
    "smg_grpc_mode": Refusal(
        lambda ns: bool(ns.smg_grpc_mode),
        _stock("this server speaks HTTP only, not SGLang's gRPC mode"),
    ),
    "grpc_mode": Refusal(
        lambda ns: bool(ns.grpc_mode),
        _stock("this server speaks HTTP only, not SGLang's gRPC mode"),
    ),
    "grpc_port": Refusal(
        lambda ns: ns.grpc_port is not None,
        _stock("SGLang's native gRPC server beside HTTP is not started here"),
    ),
    "enable_http2": Refusal(
        lambda ns: bool(ns.enable_http2),
        _stock("this server is uvicorn over HTTP/1.1, not SGLang's Granian HTTP/2 server"),
    ),
    "ssl_keyfile": Refusal(
        lambda ns: ns.ssl_keyfile is not None,
        _NO_TLS,
    ),
    "ssl_certfile": Refusal(
        lambda ns: ns.ssl_certfile is not None,
        _NO_TLS,
    ),
    "ssl_ca_certs": Refusal(
        lambda ns: ns.ssl_ca_certs is not None,
        "this server speaks plain HTTP (no client certificates): terminate TLS in a "
        f"proxy in front of it, or use stock `{_STOCK}`",
    ),
    "ssl_keyfile_password": Refusal(
        lambda ns: ns.ssl_keyfile_password is not None,
        _NO_TLS,
    ),
    "enable_ssl_refresh": Refusal(
        lambda ns: bool(ns.enable_ssl_refresh),
        _NO_TLS,
    ),
    "skip_server_warmup": Refusal(
        lambda ns: bool(ns.skip_server_warmup),
        "drop it: this server never sends SGLang's warm-up request (it marks the "
        "manager up on its owner loop), and with the flag SGLang's app would write "
        "the manager's status from the HTTP thread",
    ),
    "warmups": Refusal(
        lambda ns: ns.warmups is not None,
        "custom warm-ups are not run by this server; send the warm-up requests "
        f"yourself once it prints `serving on`, or use stock `{_STOCK}`",
    ),
    "delete_ckpt_after_loading": Refusal(
        lambda ns: bool(ns.delete_ckpt_after_loading),
        "stock deletes the checkpoint after its warm-up request, which this server "
        "does not send; delete it yourself once `serving on` is printed",
    ),
    "debug_tensor_dump_input_file": Refusal(
        lambda ns: ns.debug_tensor_dump_input_file is not None,
        _stock("a debugging run that stock ends right after its warm-up"),
    ),
    "node_rank": Refusal(
        lambda ns: ns.node_rank not in (None, 0),
        _stock("a node of rank >= 1 runs only schedulers, no HTTP server"),
    ),
    "use_ray": Refusal(
        lambda ns: bool(ns.use_ray),
        _stock("this server starts SGLang's scheduler processes, not Ray actors"),
    ),
    "encoder_only": Refusal(
        lambda ns: bool(ns.encoder_only),
        _stock("an encoder-only server (encoder disaggregation) is a different server"),
    ),
}


def server_parser() -> argparse.ArgumentParser:
    """A fresh parser with the installed SGLang's server options, as stock builds it."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def engine_fields() -> frozenset[str]:
    """The field names of the installed SGLang's ``ServerArgs``."""
    from sglang.srt.server_args import ServerArgs, record_fields

    return frozenset(f.name for f in record_fields(ServerArgs))


#: The table ``serve`` checks a command line against.
TABLE = OptionTable(
    honoured=HONOURED,
    refused=REFUSED,
    engine_fields=engine_fields,
    engine_rule=ENGINE,
    release="this SGLang release",
    stock=_STOCK,
)


def unclassified(parser: argparse.ArgumentParser) -> list[str]:
    """``dest`` of every option of ``parser`` in neither list, sorted."""
    return TABLE.unclassified(parser)


def refusals(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, given: Iterable[str]
) -> list[str]:
    """One line per option in ``ns`` that ``serve`` refuses (see :meth:`OptionTable.refusals`)."""
    return TABLE.refusals(parser, ns, given)
