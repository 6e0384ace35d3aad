"""Record the installed vLLM release's ``vllm serve`` options (one ``dest`` per line).

Run with each supported release's venv after a release is added or upgraded:

    .venv-vllm-0.29/bin/python tests/vllm/serve_options/record.py

It writes ``<major.minor>.txt`` next to this file. The test suite checks, on every
lane, that the installed release's parser has exactly the recorded options, and
that every rule of ``loopbridge_vllm._serve_options`` names an option some tested
release has (so a rule for a removed option is found).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def release() -> str:
    import vllm

    return ".".join(str(vllm.__version__).split(".")[:2])


def dests() -> list[str]:
    from loopbridge_vllm.server import _make_parser

    return sorted({action.dest for action in _make_parser()._actions})


def recorded(name: str) -> list[str] | None:
    path = HERE / f"{name}.txt"
    return path.read_text().split() if path.exists() else None


def main() -> int:
    os.environ.setdefault("LOOPBRIDGE_CPU_PLATFORM", "1")
    os.environ.pop("VLLM_TARGET_DEVICE", None)
    path = HERE / f"{release()}.txt"
    path.write_text("".join(f"{dest}\n" for dest in dests()))
    print(f"wrote {path.name}: {len(dests())} options")
    return 0


if __name__ == "__main__":
    sys.exit(main())
