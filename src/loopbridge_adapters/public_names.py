"""Each adapter package's exports report the package as their module.

What the core does for ``loopbridge`` (its private ``_public``), for the packages
around it, which use the core's public API only: ``loopbridge_adapters``,
``loopbridge_vllm`` and ``loopbridge_sglang`` each end their ``__init__`` with
:func:`publish`, so a class or function defined in one of the package's own modules
and listed in its ``__all__`` reports the package as its ``__module__``: reprs,
tracebacks and pickles say ``loopbridge_sglang.adopt_manager``, never
``loopbridge_sglang.manager.adopt_manager``. A name one package re-exports from
another keeps the other's (both adapters export ``loopbridge_adapters.ServerStartError``).

Invariant: a name is published only by the package that defines it, and its
``__qualname__`` is the name it is exported under (tests/test_public_names.py checks
every export of every package).
"""

from __future__ import annotations

import types
from collections.abc import Mapping

__all__ = ["publish"]


def publish(package: str, namespace: Mapping[str, object]) -> None:
    """Set ``__module__`` to ``package`` for each class and function of ``namespace``'s
    ``__all__`` that one of ``package``'s own modules defines (``package`` may be a
    public module with an ``__all__`` of its own, such as ``loopbridge_vllm.dp``)."""
    names = namespace["__all__"]
    assert isinstance(names, list), f"{package}.__all__ is a list of names"
    for name in names:
        # A name the module's __getattr__ loads lazily is not there yet: the
        # __getattr__ publishes it when it loads it (loopbridge_vllm.cpu_engine's does).
        obj = namespace.get(name)
        if not isinstance(obj, (type, types.FunctionType)):
            continue  # constants and aliases have no module of their own
        if obj.__module__ == package or obj.__module__.startswith(f"{package}."):
            obj.__module__ = package
