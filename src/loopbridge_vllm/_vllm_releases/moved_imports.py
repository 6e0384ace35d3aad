"""vLLM names whose module changed between supported releases.

Each function returns one piece, trying its homes newest first (see the
package docstring for the error contract).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from loopbridge_vllm._vllm_releases import import_piece

__all__ = [
    "make_arg_parser",
    "openai_app_builders",
    "serve_arg_checks",
    "ssl_cert_refresher",
    "uvicorn_log_config",
]


def make_arg_parser() -> argparse.ArgumentParser:
    """A fresh ``vllm serve`` argument parser.

    ``make_arg_parser`` lives in ``entrypoints.common.cli_args`` from 0.33,
    ``entrypoints.launchers.cli_args`` in 0.32 and ``entrypoints.openai.cli_args``
    before that.
    """
    flexible = import_piece(
        "vLLM's command-line parser class",
        [("vllm.utils.argparse_utils", "FlexibleArgumentParser")],
    )
    make = import_piece(
        "the `vllm serve` argument parser",
        [
            ("vllm.entrypoints.common.cli_args", "make_arg_parser"),
            ("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
            ("vllm.entrypoints.openai.cli_args", "make_arg_parser"),
        ],
    )
    parser: argparse.ArgumentParser = make(flexible())
    return parser


def openai_app_builders() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``build_app`` and ``init_app_state`` of vLLM's OpenAI server.

    Both live under ``entrypoints.launchers`` from 0.29 (0.29 to 0.34 alike);
    0.24 only has ``entrypoints.openai.api_server``, a deprecated re-export in
    newer ones that warns on import, so it comes last.
    """
    build_app = import_piece(
        "the OpenAI app factory (build_app)",
        [
            ("vllm.entrypoints.launchers.app", "build_app"),
            ("vllm.entrypoints.openai.api_server", "build_app"),
        ],
    )
    init_app_state = import_piece(
        "the OpenAI app state set-up (init_app_state)",
        [
            ("vllm.entrypoints.launchers.api_server.app_state", "init_app_state"),
            ("vllm.entrypoints.openai.api_server", "init_app_state"),
        ],
    )
    return build_app, init_app_state


def serve_arg_checks() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``validate_parsed_serve_args``, ``validate_api_server_args`` and
    ``propagate_flash_late_interaction``: the checks and the engine fix-up
    ``vllm serve`` applies to its namespace.

    All three live in ``entrypoints.common.cli_args`` from 0.33; in 0.32 the
    first and last are in ``entrypoints.launchers.cli_args`` and
    ``validate_api_server_args`` in ``entrypoints.launchers.launcher`` (0.29
    too); 0.24 has the first in ``entrypoints.openai.cli_args`` and the second
    in ``entrypoints.openai.api_server``. 0.29 and 0.24 have no fix-up: they
    read the flag where it applies (``entrypoints/pooling/factories.py``), so
    there the fix-up is a no-op.
    """
    validate_parsed = import_piece(
        "vllm serve's argument checks (validate_parsed_serve_args)",
        [
            ("vllm.entrypoints.common.cli_args", "validate_parsed_serve_args"),
            ("vllm.entrypoints.launchers.cli_args", "validate_parsed_serve_args"),
            ("vllm.entrypoints.openai.cli_args", "validate_parsed_serve_args"),
        ],
    )
    validate_api = import_piece(
        "vllm serve's parser-name checks (validate_api_server_args)",
        [
            ("vllm.entrypoints.common.cli_args", "validate_api_server_args"),
            ("vllm.entrypoints.launchers.launcher", "validate_api_server_args"),
            ("vllm.entrypoints.openai.api_server", "validate_api_server_args"),
        ],
    )
    propagate = import_piece(
        "vllm serve's engine fix-up (propagate_flash_late_interaction)",
        [
            ("vllm.entrypoints.common.cli_args", "propagate_flash_late_interaction"),
            ("vllm.entrypoints.launchers.cli_args", "propagate_flash_late_interaction"),
        ],
        default=_no_fix_up,
    )
    return validate_parsed, validate_api, propagate


def _no_fix_up(*args: Any) -> None:
    """Releases without ``propagate_flash_late_interaction`` need none (it is
    called as ``propagate(args, engine_args)``)."""


def uvicorn_log_config() -> Callable[..., Any]:
    """``get_uvicorn_log_config(args)``: the uvicorn log config ``vllm serve`` uses
    (``--log-config-file``, ``--disable-access-log-for-endpoints``), or ``None``.

    In ``entrypoints.launchers.utils.server_utils`` from 0.29,
    ``entrypoints.serve.utils.server_utils`` in 0.24.
    """
    get: Callable[..., Any] = import_piece(
        "vllm serve's uvicorn log config (get_uvicorn_log_config)",
        [
            ("vllm.entrypoints.launchers.utils.server_utils", "get_uvicorn_log_config"),
            ("vllm.entrypoints.serve.utils.server_utils", "get_uvicorn_log_config"),
        ],
    )
    return get


def ssl_cert_refresher() -> Callable[..., Any]:
    """vLLM's ``SSLCertRefresher`` (``--enable-ssl-refresh``).

    In ``entrypoints.launchers.utils.ssl`` from 0.29,
    ``entrypoints.serve.utils.ssl`` in 0.24.
    """
    refresher: Callable[..., Any] = import_piece(
        "vllm serve's certificate refresher (SSLCertRefresher)",
        [
            ("vllm.entrypoints.launchers.utils.ssl", "SSLCertRefresher"),
            ("vllm.entrypoints.serve.utils.ssl", "SSLCertRefresher"),
        ],
    )
    return refresher
