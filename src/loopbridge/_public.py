"""Public names report their public module.

Classes and functions are defined in private modules (``loopbridge._errors``)
and exported by a public one (``loopbridge``).  :func:`publish` makes each
exported class and function name the public module as its ``__module__``, so
reprs, tracebacks and pickles say ``loopbridge.LoopAffinityError``, and what a
pickle names is what ``import loopbridge`` provides.

Invariant: a name is published only by the module whose ``__all__`` lists it,
and its ``__qualname__`` is the name it is exported under (the test of the
public API checks both).
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping

__all__ = ["publish"]


def publish(module: str, namespace: Mapping[str, object], names: Iterable[str]) -> None:
    """Set ``__module__`` to ``module`` for every class and function in ``names``."""
    for name in names:
        obj = namespace[name]
        if isinstance(obj, (type, types.FunctionType)):
            obj.__module__ = module
