"""`@record`: frozen-dataclass semantics for mypy, without dataclasses' cost at run time.

`dataclasses` compiles an `__init__`, `__repr__`, `__eq__`, `__hash__` and `__setattr__` for
every class it decorates, and importing it pulls in `inspect`: together a large share of what
`gpuctk cdi generate` costs (docs/benchmarks.md, import costs). These
records are few and small, so one generic implementation serves them all, and
`typing.dataclass_transform` (PEP 681) tells mypy they are frozen dataclasses: constructors
stay fully type-checked.

    @record
    class Mount:
        host_path: str
        options: tuple[str, ...] = ()

Fields are the class's own annotations, in order; a class attribute of the same name is the
default (use immutable defaults). Records compare by type and fields, hash by fields, are
immutable, and `replace(r, field=value)` makes a changed copy.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the shim imports records; typing is costly
if TYPE_CHECKING:
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda function: function


_FIELDS = "__record_fields__"
_DEFAULTS = "__record_defaults__"


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    fields: tuple[str, ...] = getattr(cls, _FIELDS)
    defaults: dict[str, Any] = getattr(cls, _DEFAULTS)
    if len(args) > len(fields):
        raise TypeError(f"{cls.__name__}() takes {len(fields)} arguments, {len(args)} given")
    for name, value in zip(fields, args, strict=False):
        object.__setattr__(self, name, value)
    for name in fields[len(args) :]:
        if name in kwargs:
            value = kwargs.pop(name)
        elif name in defaults:
            value = defaults[name]
        else:
            raise TypeError(f"{cls.__name__}() missing argument {name!r}")
        object.__setattr__(self, name, value)
    if kwargs:
        raise TypeError(f"{cls.__name__}() got unexpected arguments {sorted(kwargs)}")


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in getattr(type(self), _FIELDS))


def _eq(self: Any, other: object) -> bool:
    if type(other) is not type(self):
        return NotImplemented  # type: ignore[no-any-return]
    return bool(_values(self) == _values(other))


def _hash(self: Any) -> int:
    return hash(_values(self))


def _repr(self: Any) -> str:
    fields = getattr(type(self), _FIELDS)
    body = ", ".join(f"{name}={getattr(self, name)!r}" for name in fields)
    return f"{type(self).__name__}({body})"


def _setattr(self: Any, name: str, value: Any) -> None:
    raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is immutable")


def _delattr(self: Any, name: str) -> None:
    raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is immutable")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """Make `cls` an immutable record of its annotated fields (see the module docstring)."""
    fields = tuple(cls.__dict__.get("__annotations__", {}))  # noqa: RUF063 (no inspect import)
    defaults = {name: cls.__dict__[name] for name in fields if name in cls.__dict__}
    seen_default = False
    for name in fields:
        if name in defaults:
            seen_default = True
        elif seen_default:
            raise TypeError(f"{cls.__name__}.{name}: a field without a default follows one with")
    for name, attr in (
        (_FIELDS, fields),
        (_DEFAULTS, defaults),
        ("__init__", _init),
        ("__eq__", _eq),
        ("__hash__", _hash),
        ("__repr__", _repr),
        ("__setattr__", _setattr),
        ("__delattr__", _delattr),
    ):
        setattr(cls, name, attr)
    return cls


def replace(obj: T, **changes: Any) -> T:
    """A copy of the record `obj` with some fields changed (like dataclasses.replace)."""
    cls = type(obj)
    unknown = set(changes) - set(getattr(cls, _FIELDS))
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    values = {name: getattr(obj, name) for name in getattr(cls, _FIELDS)}
    values.update(changes)
    return cls(**values)
