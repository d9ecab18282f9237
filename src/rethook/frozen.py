"""Small records, made without dataclasses' start-up cost: immutable (:class:`Frozen`) and
mutable (:class:`Fields`).

``@dataclass(frozen=True, slots=True)`` writes its methods as source text and compiles them
when the class is created: ~1 ms of every start-up per class (and importing dataclasses),
which every ``rethook`` command that runs a program paid eight times. A :class:`Frozen`
subclass lists its fields in ``__slots__`` and sets them in an ``__init__`` of its own
(``object.__setattr__``, as a frozen dataclass's does); it gets what the dataclass gave it:

- ``repr``: ``Name(field=value, ...)``, every field;
- ``==`` and ``hash`` over the fields (those named by ``compared=`` in the class statement,
  if given), with instances of the very same class only; ``eq=False``: identity;
- assigning or deleting an attribute raises ``AttributeError`` ("cannot assign to field");
- ``__match_args__``; ``pickle`` and ``copy`` make a new instance through ``__init__``.

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any


class Frozen:
    """Base of an immutable record whose fields are its ``__slots__`` (see the module)."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _key: Any = None

    def __init_subclass__(cls, compared: tuple[str, ...] | None = None, eq: bool = True,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fields = tuple(cls.__dict__.get("__slots__", ()))
        cls.__match_args__ = cls._fields
        if not eq:
            cls.__eq__ = object.__eq__  # type: ignore[method-assign]
            cls.__hash__ = object.__hash__  # type: ignore[method-assign]
            return
        names = cls._fields if compared is None else compared
        get = attrgetter(*names)  # a tuple of the values (of two names or more)
        cls._key = staticmethod(get if len(names) > 1 else lambda obj: (get(obj),))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__qualname__}({fields})"

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is self.__class__:
            return self._key(self) == self._key(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key(self))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, name) for name in self._fields)


class Fields:
    """Base of a mutable record whose fields are its ``__slots__``, set by an ``__init__`` of
    its own: what a plain ``@dataclass`` gave it, ``repr`` and ``==`` over every field (with
    instances of the very same class only) and no hash."""

    __slots__ = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # (mutable)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"
