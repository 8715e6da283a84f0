"""Building instances of frozen, slotted dataclasses cheaply, for the ingest's hot paths.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (its own
``__setattr__`` refuses): about 0.13 us per field, 1.7 us for an 11-field ``Entry``, and
receiving one entry builds several such records. ``builder(cls)`` returns a function taking the
fields positionally that fills a plain twin class with the same slots and then makes it a
``cls``: the same object (fields, equality, hash, immutability) at a fifth of the cost.
Only for classes without defaults computed in ``__init__`` or a ``__post_init__``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A function ``build(*fields)`` returning ``cls(*fields)`` (every field given, in order)."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} is not a plain dataclass")
    names = tuple(f.name for f in dataclasses.fields(cls))
    if getattr(cls, "__slots__", None) != names:
        raise TypeError(f"{cls.__name__} must have exactly its fields as slots")
    twin = type(f"_{cls.__name__}Fill", (), {"__slots__": names})
    params = ", ".join(names)
    if any(n.startswith("_") for n in names):
        raise TypeError(f"{cls.__name__}: field names starting with '_' would clash with the builder's")
    source = (f"def build({params}):\n    _self = _new(_twin)\n"
              + "".join(f"    _self.{n} = {n}\n" for n in names)
              + "    _self.__class__ = _cls\n    return _self\n")
    namespace: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    exec(source, namespace)  # the dataclasses module builds its __init__ the same way
    build: Callable[..., T] = namespace["build"]
    build.__qualname__ = f"builder({cls.__name__})"
    return build
