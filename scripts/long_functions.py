"""The functions in src/ longer than a limit, longest first.

A function's length is its lines from ``def`` to its last line, nested functions
included (a nested function is listed on its own as well), less its own docstring: a
public function documents each of its parameters there for the API reference, and
that is not code to split. Used by
tests/test_function_length.py, which holds src/ to the project's 80-line limit.

    python scripts/long_functions.py [--over 60] [ROOT ...]
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Function:
    path: Path
    qualname: str
    lineno: int
    lines: int

    def __str__(self) -> str:
        return f"{self.lines:4d}  {self.path}:{self.lineno}  {self.qualname}"


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        return 0
    if not isinstance(first.value.value, str):
        return 0
    assert first.end_lineno is not None
    return first.end_lineno - first.lineno + 1


def _walk(tree: ast.AST, path: Path, prefix: str = "") -> Iterator[Function]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            yield Function(path, name, node.lineno, length)
            yield from _walk(node, path, f"{name}.<locals>.")
        elif isinstance(node, ast.ClassDef):
            yield from _walk(node, path, f"{prefix}{node.name}.")
        else:
            yield from _walk(node, path, prefix)


def functions(roots: Iterable[Path]) -> Iterator[Function]:
    """Every function and method under ``roots`` (files or folders of ``.py`` files)."""
    for root in roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for file in files:
            tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
            shown = file.relative_to(REPO) if file.is_relative_to(REPO) else file
            yield from _walk(tree, shown)


def longer_than(limit: int, roots: Iterable[Path]) -> list[Function]:
    """The functions over ``limit`` lines, longest first."""
    found = [f for f in functions(roots) if f.lines > limit]
    return sorted(found, key=lambda f: (-f.lines, str(f.path), f.lineno))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--over", type=int, default=60, help="list functions over this many lines")
    parser.add_argument("roots", nargs="*", type=Path, default=[REPO / "src"])
    args = parser.parse_args()
    found = longer_than(args.over, args.roots)
    for function in found:
        print(function)
    print(f"{len(found)} function(s) over {args.over} lines")


if __name__ == "__main__":
    main()
