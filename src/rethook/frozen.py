"""Small records, made without dataclasses' start-up cost: immutable (:class:`Frozen`),
mutable (:class:`Fields`) and named tuples (:class:`Row`).

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

``typing.NamedTuple`` under ``from __future__ import annotations`` compiles each field's
annotation when the class is made (~0.3 ms a class). A :class:`Row` subclass is written as a
NamedTuple is (annotated fields, defaults for the last ones) and is a tuple with the same
named fields, ``_fields``, ``_asdict()`` and ``_replace()``; its annotations stay strings.

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations

from _operator import attrgetter, itemgetter  # (operator.py: ~0.3 ms of every start-up)

TYPE_CHECKING = False
if TYPE_CHECKING:
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


class Row(tuple):
    """Base of a named tuple whose fields are the class's annotated names, in order; a field
    given a value in the class statement has it as its default (see the module)."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _defaults: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls).get("__annotations__")
        if own is None:  # (where annotations are not kept in the class dict: 3.14)
            own = getattr(cls, "__annotations__", None) or {}
        if not own:  # a subclass that declares no field keeps its base's
            return
        if cls._fields:
            raise TypeError(f"{cls.__name__}: a Row's fields are declared in one class")
        names = tuple(own)
        defaults = {name: vars(cls)[name] for name in names if name in vars(cls)}
        cls._fields, cls._defaults = names, defaults
        for i, name in enumerate(names):
            setattr(cls, name, property(itemgetter(i), doc=f"Alias for field number {i}"))
        cls.__match_args__ = names

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        names = cls._fields
        if len(args) == len(names) and not kwargs:
            return tuple.__new__(cls, args)
        if len(args) > len(names):
            raise TypeError(f"{cls.__name__}() takes {len(names)} arguments, {len(args)} given")
        values = list(args)
        for name in names[len(args):]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._defaults:
                values.append(cls._defaults[name])
            else:
                raise TypeError(f"{cls.__name__}() missing argument {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected arguments {sorted(kwargs)}")
        return tuple.__new__(cls, values)

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in self._asdict().items())
        return f"{type(self).__qualname__}({fields})"

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))

    def _replace(self, **changes: Any) -> Any:
        return type(self)(**{**self._asdict(), **changes})
