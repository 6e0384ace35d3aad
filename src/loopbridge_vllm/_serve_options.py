"""Every ``vllm serve`` option, honoured or refused by ``python -m loopbridge_vllm serve``.

The options come from the installed vLLM's own ``serve`` parser, never from a
list kept here. Each one is in exactly one of two lists:

- **honoured**: it has the effect it has with stock ``vllm serve``. An option
  that is a field of ``AsyncEngineArgs`` is honoured because the engine is
  built from the same namespace (``AsyncEngineArgs.from_cli_args``), unless a
  rule below says otherwise; every other option has a rule in
  :data:`HONOURED` saying who acts on it.
- **refused**: a rule in :data:`REFUSED` says for which values, and what to do
  instead. ``serve`` then exits at once with status 2 and one line.

An option of the installed vLLM that no rule covers is
:func:`unclassified`; ``serve`` refuses it when it is given, and the test
suite fails on it (the same fail-closed guard as the engine proxy's ``RULES``).
The table's logic is shared with the SGLang adapter
(:mod:`loopbridge_adapters.serve_cli`); the rules here are vLLM's.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    "unclassified",
]

#: What honours an option that is a field of ``AsyncEngineArgs``.
ENGINE = "the engine is built from it (AsyncEngineArgs.from_cli_args)"

_APP = "vLLM's build_app / init_app_state read it from the namespace"
_HTTP = "the HTTP server's uvicorn settings, as vLLM's serve_http sets them"
_MULTI_PORT = "used by stock only with --data-parallel-multi-port-external-lb (refused)"

#: Options that are not engine fields, or engine fields the server also reads:
#: ``dest`` -> who acts on it.
HONOURED: dict[str, str] = {
    "help": "prints vLLM's option help",
    "model_tag": "the model, like loopbridge's MODEL argument (giving both is an error)",
    "config": "vLLM's parser reads the YAML file into options",
    # Binding (python -m loopbridge_vllm serve binds before building the engine).
    "host": "the address bound (giving it before and after -- is an error)",
    "port": "the port bound (giving it before and after -- is an error)",
    "uds": "a Unix socket is bound instead of host and port",
    # uvicorn, as vLLM's build_and_serve / serve_http configure it.
    "uvicorn_log_level": _HTTP,
    "disable_uvicorn_access_log": _HTTP,
    "disable_access_log_for_endpoints": _HTTP + " (vLLM's uvicorn log config)",
    "ssl_keyfile": _HTTP,
    "ssl_certfile": _HTTP,
    "ssl_ca_certs": _HTTP,
    "ssl_cert_reqs": _HTTP,
    "ssl_ciphers": _HTTP,
    "enable_ssl_refresh": "vLLM's SSLCertRefresher reloads the certificates on the server loop",
    "h11_max_incomplete_event_size": _HTTP,
    "h11_max_header_count": _HTTP,
    # Start-up steps of vLLM's launcher.
    "tool_parser_plugin": "imported before the app is built, as vLLM's launcher does",
    "reasoning_parser_plugin": "imported before the app is built, as vLLM's launcher does",
    "log_config_file": ENGINE + "; also the uvicorn log config, as vLLM's launcher does",
    "logging_config": ENGINE + "; also the uvicorn log config, as vLLM's launcher does",
    "shutdown_timeout": ENGINE + "; also the drain on SIGINT/SIGTERM (--grace)",
    "enable_flash_late_interaction": _APP + "; propagated to the engine's pooler config",
    # Read by the app.
    "lora_modules": _APP,
    "chat_template": _APP,
    "chat_template_content_format": _APP,
    "trust_request_chat_template": _APP,
    "trust_request_mm_kwargs": _APP,
    "default_chat_template_kwargs": _APP,
    "reasoning_effort_map": _APP,
    "response_role": _APP,
    "return_tokens_as_token_ids": _APP,
    "enable_auto_tool_choice": _APP,
    "exclude_tools_when_tool_choice_none": _APP,
    "tool_call_parser": _APP,
    "tool_strict_level": _APP,
    "tool_server": _APP,
    "max_log_len": _APP,
    "enable_prompt_tokens_details": _APP,
    "enable_per_request_metrics": _APP,
    "enable_server_load_tracking": _APP,
    "enable_force_include_usage": _APP,
    "sse_keep_alive_interval": _APP,
    "enable_tokenizer_info_endpoint": _APP,
    "enable_log_outputs": _APP,
    "enable_log_deltas": _APP,
    "cohere_is_reasoning_model": _APP,
    "cohere_format": _APP,
    "anthropic_disabled_thinking_effort": _APP,
    "log_error_stack": _APP,
    "enable_scale_out": _APP,
    "fingerprint_mode": _APP,
    "fingerprint_value": _APP,
    "allow_credentials": _APP + " (CORS middleware)",
    "allowed_origins": _APP + " (CORS middleware)",
    "allowed_methods": _APP + " (CORS middleware)",
    "allowed_headers": _APP + " (CORS middleware)",
    "api_key": _APP + " (authentication middleware)",
    "root_path": _APP,
    "middleware": _APP,
    "enable_request_id_headers": _APP,
    "disable_fastapi_docs": _APP,
    "enable_offline_docs": _APP,
    # Multi-port external load balancing only (refused below).
    "data_parallel_supervisor_port": _MULTI_PORT,
    "dp_supervisor_probe_interval_s": _MULTI_PORT,
    "dp_supervisor_probe_timeout_s": _MULTI_PORT,
    "dp_supervisor_probe_failure_threshold": _MULTI_PORT,
    # 0.34: where a headless engine node's front end hands its ZMQ addresses over.
    "headless_client_handshake_address": "used by stock only with --headless (refused)",
}


_ONE_SERVER = (
    "this server is one API server in the engine's process; use stock `vllm serve` for {what}"
)


def _several_api_servers(ns: argparse.Namespace) -> bool:
    # --api-server-count itself asks for several.
    count = ns.api_server_count
    return count is not None and int(count) != 1 and not ns.headless


def _one_api_server_per_rank(ns: argparse.Namespace) -> bool:
    # Stock's default without --api-server-count: one API server per data-parallel
    # rank (internal load balancing); the option the user gave is the rank count.
    count = ns.api_server_count
    return count is None and int(ns.data_parallel_size) != 1 and not ns.headless


#: ``dest`` -> when it is refused, and what to do instead.
REFUSED: dict[str, Refusal] = {
    "api_server_count": Refusal(
        _several_api_servers,
        "stock would run several API server processes; pass --api-server-count 1 "
        "for one API server over all data-parallel ranks, or use stock `vllm serve` "
        "for several",
    ),
    "data_parallel_size": Refusal(
        _one_api_server_per_rank,
        "with several data-parallel ranks stock runs one API server process per rank; "
        "add --api-server-count 1 for one API server over all ranks, or use stock "
        "`vllm serve` for several",
    ),
    "headless": Refusal(
        lambda ns: bool(ns.headless),
        _ONE_SERVER.format(what="engine-only (headless) nodes"),
    ),
    "grpc": Refusal(
        lambda ns: bool(ns.grpc),
        "this server speaks HTTP only; use stock `vllm serve --grpc` for gRPC",
    ),
    "grpc_port": Refusal(
        lambda ns: ns.grpc_port is not None,
        "gRPC services belong to vLLM's Rust front end; use stock "
        "`VLLM_USE_RUST_FRONTEND=1 vllm serve` for them",
    ),
    "data_parallel_external_lb": Refusal(
        lambda ns: bool(ns.data_parallel_external_lb),
        _ONE_SERVER.format(what="external data-parallel load balancing"),
    ),
    "data_parallel_rank": Refusal(
        lambda ns: ns.data_parallel_rank is not None,
        _ONE_SERVER.format(what="external data-parallel load balancing (--data-parallel-rank)"),
    ),
    "data_parallel_hybrid_lb": Refusal(
        lambda ns: bool(ns.data_parallel_hybrid_lb),
        _ONE_SERVER.format(what="hybrid data-parallel load balancing"),
    ),
    "data_parallel_start_rank": Refusal(
        lambda ns: ns.data_parallel_start_rank is not None,
        _ONE_SERVER.format(what="hybrid data-parallel load balancing (--data-parallel-start-rank)"),
    ),
    "data_parallel_multi_port_external_lb": Refusal(
        lambda ns: bool(ns.data_parallel_multi_port_external_lb),
        _ONE_SERVER.format(what="multi-port external data-parallel load balancing"),
    ),
}


def engine_fields() -> frozenset[str]:
    """The field names of the installed vLLM's ``AsyncEngineArgs``."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return frozenset(f.name for f in dataclasses.fields(AsyncEngineArgs))


#: The table ``serve`` checks a command line against.
TABLE = OptionTable(
    honoured=HONOURED,
    refused=REFUSED,
    engine_fields=engine_fields,
    engine_rule=ENGINE,
    release="this vLLM release",
    stock="vllm serve",
)


def unclassified(parser: argparse.ArgumentParser) -> list[str]:
    """``dest`` of every option of ``parser`` in neither list, sorted."""
    return TABLE.unclassified(parser)


def refusals(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, given: Iterable[str]
) -> list[str]:
    """One line per option in ``ns`` that ``serve`` refuses (see :meth:`OptionTable.refusals`)."""
    return TABLE.refusals(parser, ns, given)
