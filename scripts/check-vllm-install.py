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

import ast
import importlib
import os
import sys
from pathlib import Path

ADAPTER = Path(__file__).resolve().parent.parent / "src" / "loopbridge_vllm"
# Imported by the adapter's benchmark and tests only, not needed to serve.
OPTIONAL = {"httpx", "matplotlib", "tqdm"}


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    # Inside `try: ... except ImportError` (an optional import) or `if TYPE_CHECKING:`.
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in {"ImportError", "ModuleNotFoundError"}
            for h in node.handlers
        ):
            return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def wanted_imports() -> set[tuple[str, str | None]]:
    """``(module, name)`` pairs the adapter imports unguarded (name None: the module)."""
    wanted: set[tuple[str, str | None]] = set()
    for path in sorted(ADAPTER.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if _guarded(node, parents):
                continue
            if isinstance(node, ast.Import):
                wanted.update((alias.name, None) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                wanted.update((node.module, alias.name) for alias in node.names)
    return {
        (module, name)
        for module, name in wanted
        if module.split(".")[0] not in sys.stdlib_module_names
        and module.split(".")[0] not in {"loopbridge", "loopbridge_vllm"}
        and module.split(".")[0] not in OPTIONAL
    }


def main() -> int:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    problems: list[str] = []
    for module, name in sorted(wanted_imports(), key=lambda pair: (pair[0], pair[1] or "")):
        shown = module if name is None else f"{module}.{name}"
        try:
            imported = importlib.import_module(module)
            if name is not None:
                getattr(imported, name)
        except ModuleNotFoundError as exc:
            problems.append(f"{shown}: the package {exc.name!r} is not installed")
        except Exception as exc:  # any import-time failure is a broken install
            problems.append(f"{shown}: {type(exc).__name__}: {exc}")
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
