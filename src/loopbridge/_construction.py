"""Public types that only loopbridge builds.

Some classes are public so that users can name them in annotations and
``isinstance`` checks (the blocking face, its streams, a lag monitor, an
object's metrics), but an instance built by hand would skip what its factory
sets up: a proxy to wrap, a registered probe, a registry entry. Their metaclass
makes ``Cls(...)`` a :class:`TypeError` that names the factory; loopbridge
itself builds them with ``Cls._create(...)``.
"""

from __future__ import annotations

from typing import NoReturn, TypeVar

__all__ = ["NoPublicConstructor"]

T = TypeVar("T")


class NoPublicConstructor(type):
    """Metaclass: calling the class raises; ``_create`` builds an instance.

    A class may set ``_lb_factory`` to the public way of getting one, which the
    error message then names.
    """

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        factory = getattr(cls, "_lb_factory", None)
        hint = f"; get one from {factory}" if factory else ""
        raise TypeError(f"{cls.__qualname__} has no public constructor{hint}")

    def _create(cls: type[T], *args: object, **kwargs: object) -> T:
        # type.__call__ runs __new__ and __init__ as a plain class call would.
        return type.__call__(cls, *args, **kwargs)  # type: ignore[no-any-return]
