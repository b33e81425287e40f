"""JSON for the container-create path, through the stdlib's C scanner and encoder directly.

`import json` costs the shim `re`, `enum` and the json package's Python layers (a fifth of an
interpreter start: docs/benchmarks.md) for nothing: the work is done by `_json`'s C functions,
which these wrappers call with the same settings `json.loads`/`json.dumps` would. The json
package is imported only on an error path, to say what is wrong with a malformed document.

    loads(text)                       one document; NaN/Infinity refused; ValueError
    loads(text, pairs_hook=f)         f(list of (key, value)) builds each object;
                                      unique_pairs refuses duplicate keys
    dumps(value)                      compact UTF-8 bytes, non-ASCII kept
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WS = " \t\n\r"


class NestingError(ValueError):
    """The document nests deeper than the interpreter's recursion limit."""


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A `pairs_hook` that refuses an object naming a key twice (ValueError)."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _HookError(Exception):
    """A ValueError raised by a caller's hook, carried past the scanner's own ValueErrors."""


def _carried(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def call(arg: Any) -> Any:
        try:
            return hook(arg)
        except ValueError as exc:
            raise _HookError(exc) from None

    return call


class _Context:
    """The attributes `_json.make_scanner` reads (json.JSONDecoder's, without its imports)."""

    strict = True
    object_hook = None
    parse_float = float
    parse_int = int

    def __init__(
        self,
        pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None,
        parse_constant: Callable[[str], Any],
    ) -> None:
        self.object_pairs_hook = pairs_hook
        self.parse_constant = parse_constant


def _detail(text: str, **kwargs: Any) -> str:
    """What the json package says is wrong with `text` (error path only)."""
    import json

    try:
        json.loads(text, **kwargs)
    except json.JSONDecodeError as exc:
        return f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
    except ValueError as exc:
        return str(exc)
    return "invalid JSON"


def loads(
    text: str,
    pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
    parse_constant: Callable[[str], Any] = _refuse_constant,
) -> Any:
    """Decode one JSON document, as `json.loads(text, object_pairs_hook=pairs_hook,
    parse_constant=parse_constant)` would; ValueError (with json's message) when malformed.
    NestingError (a ValueError) when it nests too deeply for the interpreter. Exceptions
    raised by the hooks propagate unchanged."""
    try:
        import _json

        context = _Context(pairs_hook and _carried(pairs_hook), _carried(parse_constant))
        scan = _json.make_scanner(context)  # type: ignore[arg-type]
    except (ImportError, AttributeError):  # pragma: no cover - CPython always has it
        import json

        return json.loads(text, object_pairs_hook=pairs_hook, parse_constant=parse_constant)
    start = len(text) - len(text.lstrip(_WS))
    try:
        value, end = scan(text, start)
    except _HookError as exc:
        raise exc.args[0] from None
    except RecursionError:
        raise NestingError("JSON nested too deeply") from None
    except (StopIteration, ValueError, SystemError):
        # The C scanner reports details through json.decoder, which it does not import.
        raise ValueError(_detail(text, parse_constant=_refuse_constant)) from None
    rest = text[end:]
    if rest.strip(_WS):
        raise ValueError(_detail(text, parse_constant=_refuse_constant))
    return value


_FLAGS = (False, False, False)  # sort_keys, skipkeys, allow_nan


def _unencodable(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (non-ASCII kept; \\u escapes when a string cannot be UTF-8)."""
    try:
        import _json

        for escape in (_json.encode_basestring, _json.encode_basestring_ascii):
            encoder = _json.make_encoder(None, _unencodable, escape, None, ":", ",", *_FLAGS)
            try:
                return "".join(encoder(value, 0)).encode("utf-8")
            except UnicodeEncodeError:
                continue
        raise ValueError("cannot encode the document")
    except (ImportError, AttributeError, TypeError):  # pragma: no cover
        import json

        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
