"""Print the requirements of pyproject.toml's dependency groups, one a line.

Used where a venv installs a group's packages one at a time (a free-threaded
Python, which some of them have no wheel for): ``python _dependency_groups.py test
recipes``.  Included groups are followed; markers that do not hold are dropped.
"""

from __future__ import annotations

import operator
import re
import sys
from pathlib import Path

import tomllib

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _holds(marker: str) -> bool:
    """A ``python_version <op> 'X.Y'`` marker (the only kind the groups use)."""
    m = re.fullmatch(r"python_version\s*(<=|>=|<|>)\s*['\"](\d+)\.(\d+)['\"]", marker.strip())
    if m is None:
        raise SystemExit(f"unsupported marker: {marker}")
    return _OPS[m[1]](sys.version_info[:2], (int(m[2]), int(m[3])))


def requirements(groups: dict[str, list[object]], name: str) -> list[str]:
    out: list[str] = []
    for item in groups[name]:
        if isinstance(item, dict):
            out += requirements(groups, str(item["include-group"]))
            continue
        req, _, marker = str(item).partition(";")
        if not marker or _holds(marker):
            out.append(req.strip())
    return out


def main() -> None:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    groups = tomllib.loads(pyproject.read_text())["dependency-groups"]
    seen: list[str] = []
    for name in sys.argv[1:]:
        seen += [r for r in requirements(groups, name) if r not in seen]
    print("\n".join(seen))


if __name__ == "__main__":
    main()
