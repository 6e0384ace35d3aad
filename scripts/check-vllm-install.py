"""Check that the installed vLLM has everything the adapter imports.

vLLM is installed without its dependency resolution (see requirements/), so a
missing package shows up only when a module that needs it is imported. This
imports, in one process, every vLLM module and name that src/loopbridge_vllm (and
its benchmark, src/loopbridge_bench/vllm) imports without an ImportError guard (read from the source, so the check
follows the code), every other third-party module it imports, and the pieces
whose home differs between vLLM releases (the serve path's too: its argument
checks, uvicorn log config and certificate refresher). Exit status 1 and one
line per missing piece if anything fails. On a release outside the tested ones
it prints one line naming the nearest tested release; otherwise it prints
nothing on success.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _adapter_imports import import_problems

ADAPTER = Path(__file__).resolve().parent.parent / "src" / "loopbridge_vllm"


def main() -> int:
    os.environ.setdefault("LOOPBRIDGE_CPU_PLATFORM", "1")  # see loopbridge_vllm._cpu_platform
    os.environ.pop("VLLM_TARGET_DEVICE", None)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    # 0.29 and 0.24 log INFO lines on import; the check prints only what is missing.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    problems = import_problems("loopbridge_vllm", set()) + import_problems(
        "loopbridge_bench/vllm", set()
    )
    sys.path.insert(0, str(ADAPTER.parent))
    from loopbridge_vllm._vllm_releases import (
        MissingVllmPiece,
        moved_imports,
        untested_release_note,
    )

    note = untested_release_note()
    if note is not None:
        print(f"untested: {note}")
    pieces = (
        moved_imports.make_arg_parser,
        moved_imports.openai_app_builders,
        moved_imports.serve_arg_checks,
        moved_imports.uvicorn_log_config,
        moved_imports.ssl_cert_refresher,
    )
    for piece in pieces:
        try:
            piece()
        except MissingVllmPiece as exc:
            problems.append(str(exc))
    for line in problems:
        print(f"missing: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
