"""Check that the installed vLLM has everything the adapter imports.

vLLM is installed without its dependency resolution (see requirements/), so a
missing package shows up only when a module that needs it is imported. This
imports, in one process, every vLLM module and name that src/loopbridge_vllm
imports without an ImportError guard (read from the source, so the check
follows the code), every other third-party module it imports, and the pieces
whose home differs between vLLM releases. Exit status 1 and one line per
missing piece if anything fails; prints nothing on success.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _adapter_imports import import_problems

ADAPTER = Path(__file__).resolve().parent.parent / "src" / "loopbridge_vllm"
# Imported by the adapter's benchmark and tests only, not needed to serve.
OPTIONAL = {"httpx", "matplotlib", "tqdm"}


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    problems = import_problems("loopbridge_vllm", OPTIONAL)
    sys.path.insert(0, str(ADAPTER.parent))
    from loopbridge_vllm._vllm_releases import MissingVllmPiece
    from loopbridge_vllm._vllm_releases.moved_imports import make_arg_parser, openai_app_builders

    for piece in (make_arg_parser, openai_app_builders):
        try:
            piece()
        except MissingVllmPiece as exc:
            problems.append(str(exc))
    for line in problems:
        print(f"missing: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
