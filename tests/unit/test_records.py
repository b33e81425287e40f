"""gpuctk.records: the dataclass-compatible records the generator's hot path uses."""

from __future__ import annotations

import pytest

from gpuctk.records import record, replace


@record
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@record
class Other:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


def test_positional_keyword_and_defaults() -> None:
    assert Point(1).y == 0 and Point(1).tags == ()
    assert Point(1, 2) == Point(x=1, y=2) == Point(1, y=2)
    assert repr(Point(1, 2, ("a",))) == "Point(x=1, y=2, tags=('a',))"


def test_argument_errors_name_the_field() -> None:
    with pytest.raises(TypeError, match="missing argument 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected arguments \\['z'\\]"):
        Point(1, z=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="takes 3 arguments, 4 given"):
        Point(1, 2, (), 4)  # type: ignore[call-arg]


def test_equality_is_by_type_and_fields_and_hash_follows() -> None:
    assert Point(1, 2) != Point(1, 3)
    assert Point(1, 2) != Other(1, 2)
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert len({Point(1, 2), Point(1, 2), Point(2, 1)}) == 2


def test_immutable() -> None:
    p = Point(1)
    with pytest.raises(AttributeError, match="immutable"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del p.x  # type: ignore[misc]


def test_replace_copies_with_changes_and_rejects_unknown_fields() -> None:
    p = Point(1, 2, ("a",))
    assert replace(p, y=5) == Point(1, 5, ("a",))
    assert p == Point(1, 2, ("a",))
    with pytest.raises(TypeError, match="no fields \\['z'\\]"):
        replace(p, z=1)


def test_a_field_without_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="follows one with"):

        @record
        class Bad:
            a: int = 0
            b: int
