"""The engines' adapters on a free-threaded Python: refused at import, in one line.

loopbridge's core runs on a free-threaded build (3.13t), with the GIL on or off.
vLLM and SGLang do not yet: their compiled wheels are built for the standard ABI
(vLLM's are ``cp38-abi3``, which a free-threaded interpreter cannot load), so an
adapter imported there says so at once instead of failing at the engine's import.
"""

from __future__ import annotations

import sys
import sysconfig

from loopbridge import UnsupportedRuntime

__all__ = ["FREE_THREADED", "refuse_free_threaded"]

#: A free-threaded build (``--disable-gil``), whether or not its GIL is on now.
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def refuse_free_threaded(package: str, engine: str, why: str) -> None:
    """Raise :class:`~loopbridge.UnsupportedRuntime` on a free-threaded build."""
    if FREE_THREADED:
        version = ".".join(map(str, sys.version_info[:2]))
        raise UnsupportedRuntime(
            f"{package}: {engine} does not support a free-threaded Python yet ({why}); "
            f"run it on a standard build of Python {version} (loopbridge itself runs here)"
        )
