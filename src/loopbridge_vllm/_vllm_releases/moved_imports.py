"""vLLM names whose module changed between supported releases.

Each function returns one piece, trying its homes newest first (see the
package docstring for the error contract).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from loopbridge_vllm._vllm_releases import import_piece

__all__ = ["make_arg_parser", "openai_app_builders", "serve_arg_checks", "uvicorn_log_config"]


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

    Both live under ``entrypoints.launchers`` since 0.30 (0.32 and 0.33
    alike); older releases only have ``entrypoints.openai.api_server``, a
    deprecated re-export in newer ones that warns on import, so it comes last.
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
    ``validate_api_server_args`` in ``entrypoints.launchers.launcher``.
    """
    validate_parsed = import_piece(
        "vllm serve's argument checks (validate_parsed_serve_args)",
        [
            ("vllm.entrypoints.common.cli_args", "validate_parsed_serve_args"),
            ("vllm.entrypoints.launchers.cli_args", "validate_parsed_serve_args"),
        ],
    )
    validate_api = import_piece(
        "vllm serve's parser-name checks (validate_api_server_args)",
        [
            ("vllm.entrypoints.common.cli_args", "validate_api_server_args"),
            ("vllm.entrypoints.launchers.launcher", "validate_api_server_args"),
        ],
    )
    propagate = import_piece(
        "vllm serve's engine fix-up (propagate_flash_late_interaction)",
        [
            ("vllm.entrypoints.common.cli_args", "propagate_flash_late_interaction"),
            ("vllm.entrypoints.launchers.cli_args", "propagate_flash_late_interaction"),
        ],
    )
    return validate_parsed, validate_api, propagate


def uvicorn_log_config() -> Callable[..., Any]:
    """``get_uvicorn_log_config(args)``: the uvicorn log config ``vllm serve`` uses
    (``--log-config-file``, ``--disable-access-log-for-endpoints``), or ``None``.

    In ``entrypoints.launchers.utils.server_utils`` in 0.32 and 0.33.
    """
    get: Callable[..., Any] = import_piece(
        "vllm serve's uvicorn log config (get_uvicorn_log_config)",
        [("vllm.entrypoints.launchers.utils.server_utils", "get_uvicorn_log_config")],
    )
    return get
