"""Record: a small immutable value class, cheaper to define than a dataclass.

The CLI imports this package on every fence command, and each frozen dataclass costs about
1.6 ms to create at import time (it generates and compiles code); nine of them were a third of the
fence's start-up. A Record is defined by ``__slots__`` (its fields, in order) and ``_defaults``;
it gets keyword/positional construction, immutability, ``==`` over the fields, a repr and
``replace()``.

For mypy, Record is a dataclass_transform class: a subclass's annotated fields, in the order of
its ``__slots__``, are its constructor's parameters, type-checked at every call. A field with a
default is annotated, with that default, under ``if TYPE_CHECKING:`` (a class variable of the
same name would collide with its slot); ``_defaults`` holds the default at run time. Nothing of
this runs: ``_Typed`` is ``object`` outside type checking (tests/test_record_shapes.py holds the
annotations to the slots).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar, dataclass_transform

    R = TypeVar("R", bound="Record")

    @dataclass_transform(eq_default=False, frozen_default=True)
    class _Typed:
        pass
else:
    _Typed = object


_MISSING = object()


class Record(_Typed):
    __slots__: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}
    _no_compare: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self.__slots__
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(fields)} arguments")
        put = object.__setattr__
        for name, value in zip(fields, args, strict=False):
            put(self, name, value)
        for name in fields[len(args):]:
            value = kwargs.pop(name, _MISSING)
            if value is _MISSING:
                if name not in self._defaults:
                    raise TypeError(f"{type(self).__name__} needs {name}")
                value = self._defaults[name]
                if isinstance(value, (dict, list)):
                    value = type(value)(value)  # never share a mutable default
            put(self, name, value)
        if kwargs:
            raise TypeError(f"{type(self).__name__} has no field {next(iter(kwargs))!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__
                   if f not in self._no_compare)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__
                          if f not in self._no_compare)
        return f"{type(self).__name__}({inner})"

    def replace(self: R, **changes: Any) -> R:
        """A copy with some fields changed (no validation runs again)."""
        new = object.__new__(type(self))
        put = object.__setattr__
        for f in self.__slots__:
            put(new, f, changes.pop(f) if f in changes else getattr(self, f))
        if changes:
            raise TypeError(f"{type(self).__name__} has no field {next(iter(changes))!r}")
        return new

    def __reduce__(self) -> Any:  # copy and pickle work field by field
        return (_rebuild, (type(self), tuple(getattr(self, f) for f in self.__slots__)))


def _rebuild(cls: type[R], values: tuple[Any, ...]) -> R:
    new = object.__new__(cls)
    for f, v in zip(cls.__slots__, values, strict=True):
        object.__setattr__(new, f, v)
    return new
