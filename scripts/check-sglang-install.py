"""Check that the installed SGLang has everything the adapter imports.

SGLang is installed without its dependency resolution (see requirements/), so a
missing package shows up only when a module that needs it is imported. This imports,
in one process, every SGLang module and name that src/loopbridge_sglang (and its
benchmark, src/loopbridge_bench/sglang) imports without an ImportError guard (read from the source, so the check follows the code),
every other third-party module it imports, and the two SGLang modules the adapter
loads on first use: the TokenizerManager and the HTTP server. Exit status 1 and one
line per missing piece if anything fails; prints nothing on success.
"""

from __future__ import annotations

import sys

from _adapter_imports import import_problems

# Loaded lazily by the adapter (importing them takes 10-20 s), needed all the same.
LAZY = ("sglang.srt.managers.tokenizer_manager", "sglang.srt.entrypoints.http_server")


def main() -> int:
    problems = import_problems("loopbridge_sglang", set()) + import_problems(
        "loopbridge_bench/sglang", set()
    )
    for module in LAZY:
        try:
            __import__(module)
        except ModuleNotFoundError as exc:
            problems.append(f"{module}: the package {exc.name!r} is not installed")
        except Exception as exc:  # any import-time failure is a broken install
            problems.append(f"{module}: {type(exc).__name__}: {exc}")
    for line in problems:
        print(f"missing: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
