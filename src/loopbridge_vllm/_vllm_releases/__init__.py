"""Every difference between the vLLM releases the adapter supports, in one place.

The rest of the adapter never asks which vLLM is installed: it imports each
piece that differs between releases from here, where one submodule per kind of
difference says what changed and in which release:

- :mod:`.moved_imports`: names whose module changed;
- :mod:`.changed_signatures`: calls vLLM makes with different arguments;
- :mod:`.changed_fields`: data whose fields or constants differ (found by the
  fields the installed classes have).

Which release a lane tests, and what each lacks, is CONTRIBUTING.md's release table;
:data:`SUPPORTED_RELEASES` is its list, and :func:`untested_release_note` the
one line for a release outside it.

Invariants: a piece is looked up by trying its known homes, newest release
first, never by comparing version strings, so a future release that keeps a
piece where it is works unchanged. When no home has it, or a home exists but
cannot import because a package vLLM needs is missing, :class:`MissingVllmPiece`
names the piece, what was tried, the missing package if any, and the releases
this adapter was tested with.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

__all__ = [
    "SUPPORTED_RELEASES",
    "MissingVllmPiece",
    "UntestedReleaseWarning",
    "import_piece",
    "installed_release",
    "nearest_supported",
    "untested_release_note",
]

#: vLLM releases (major.minor) the adapter is tested with, oldest first: each
#: has a CI lane (CONTRIBUTING.md's release table says which tests each lane runs).
SUPPORTED_RELEASES = ("0.24", "0.29", "0.32", "0.33", "0.34")


class UntestedReleaseWarning(UserWarning):
    """The installed vLLM is not a release the adapter is tested with."""


class MissingVllmPiece(ImportError):
    """A piece of vLLM the adapter needs is not where any supported release has it."""


def installed_release() -> str:
    """The installed vLLM's version string (``"not installed"`` without vLLM)."""
    try:
        import vllm
    except ImportError:
        return "not installed"
    return str(getattr(vllm, "__version__", "unknown"))


def _key(release: str) -> tuple[int, int] | None:
    parts = release.split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None


def nearest_supported(version: str) -> str:
    """The tested release nearest to ``version`` (the newer one on a tie)."""
    key = _key(version)
    if key is None:
        return SUPPORTED_RELEASES[-1]

    def distance(release: str) -> tuple[int, int]:
        major, minor = _key(release) or (0, 0)
        return abs((major - key[0]) * 1000 + minor - key[1]), -minor

    return min(SUPPORTED_RELEASES, key=distance)


def untested_release_note(version: str | None = None) -> str | None:
    """One line when ``version`` (default: the installed vLLM's) is outside the
    tested releases, naming the nearest one; ``None`` for a tested release."""
    version = installed_release() if version is None else version
    key = _key(version)
    if key is not None and f"{key[0]}.{key[1]}" in SUPPORTED_RELEASES:
        return None
    nearest = nearest_supported(version)
    return (
        f"vLLM {version} is not a release loopbridge_vllm is tested on (tested: "
        f"{', '.join(SUPPORTED_RELEASES)}); the nearest tested release is {nearest} "
        f"(LOOPBRIDGE_VLLM={nearest} bash scripts/setup.sh builds it)"
    )


def _support_note() -> str:
    return (
        f"installed vLLM: {installed_release()}; "
        f"this adapter supports vLLM {', '.join(SUPPORTED_RELEASES)}"
    )


def _absent(module: str, missing: str | None) -> bool:
    # True when the module itself (or a package above it) does not exist, as
    # opposed to a module that exists but imports something not installed.
    return missing is not None and (module == missing or module.startswith(missing + "."))


_NO_DEFAULT: Any = object()


def import_piece(piece: str, homes: Sequence[tuple[str, str]], default: Any = _NO_DEFAULT) -> Any:
    """The attribute ``piece`` from the first of its ``(module, name)`` homes.

    ``piece`` says what it is for in error messages. Homes are tried in order;
    a home whose module exists but fails to import because a dependency is
    missing stops the search with that dependency named, since an older home
    would only hide the real problem. ``default``, when given, stands in for a
    piece that older releases do not have at all (never for a missing
    dependency).
    """
    tried: list[str] = []
    for module_name, attr in homes:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if not _absent(module_name, exc.name):
                raise MissingVllmPiece(
                    f"{piece}: {module_name} needs the Python package {exc.name!r}, "
                    f"which is not installed ({_support_note()})"
                ) from exc
            tried.append(f"{module_name}.{attr}")
            continue
        try:
            return getattr(module, attr)
        except AttributeError:
            tried.append(f"{module_name}.{attr}")
    if default is not _NO_DEFAULT:
        return default
    raise MissingVllmPiece(f"{piece}: none of {', '.join(tried)} exists ({_support_note()})")
