"""What an engine adapter imports, read from its source, and a check that it all imports.

Engines are installed without their dependency resolution (see requirements/), so a
missing package shows up only when a module that needs it is imported. The
check-<engine>-install.py scripts use this to import, in one process, every module and
name that the adapter imports without an ImportError guard (read from the source, so
the check follows the code).
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


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


def wanted_imports(adapter: str, optional: set[str]) -> set[tuple[str, str | None]]:
    """``(module, name)`` pairs the adapter imports unguarded (name None: the module).

    ``adapter`` is a folder under src/: a package, or one below it (``loopbridge_bench/vllm``).
    """
    wanted: set[tuple[str, str | None]] = set()
    for path in sorted((SRC / adapter).rglob("*.py")):
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
        and not module.split(".")[0].startswith("loopbridge")
        and module.split(".")[0] not in optional
    }


def import_problems(adapter: str, optional: set[str]) -> list[str]:
    """One line per module or name of :func:`wanted_imports` that fails to import."""
    problems: list[str] = []
    for module, name in sorted(wanted_imports(adapter, optional), key=lambda p: (p[0], p[1] or "")):
        shown = module if name is None else f"{module}.{name}"
        try:
            imported = importlib.import_module(module)
            if name is not None and not hasattr(imported, name):
                # `from package import submodule` imports the submodule.
                importlib.import_module(f"{module}.{name}")
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing.split(".")[0] == module.split(".")[0]:
                # The engine itself lacks it: a name this release does not have.
                problems.append(f"{shown}: not in the installed release ({missing} does not exist)")
            else:
                problems.append(f"{shown}: the package {missing!r} is not installed")
        except Exception as exc:  # any import-time failure is a broken install
            problems.append(f"{shown}: {type(exc).__name__}: {exc}")
    return problems
