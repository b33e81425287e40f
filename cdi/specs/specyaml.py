"""Strict YAML decoding for spec files, kept apart so that JSON specs never import PyYAML."""

from __future__ import annotations

from typing import Any

import yaml

from gpuctk.cdi.specs.specfile import _DocumentError

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR_TAG = "tag:yaml.org,2002:str"


class _StrictLoader(_BaseLoader):  # type: ignore[misc,valid-type]
    """A safe loader that refuses duplicate keys, aliases, merge keys and non-string keys."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.constructed_objects or node in self.recursive_objects:
            raise _DocumentError(f"YAML anchors and aliases are not allowed{_where(node)}")
        return super().construct_object(node, deep=deep)

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> Any:
        if not isinstance(node, yaml.MappingNode):
            raise _DocumentError(f"expected a mapping{_where(node)}")
        seen: set[str] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STR_TAG:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _DocumentError(f"YAML merge keys (<<) are not allowed{_where(key_node)}")
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                raise _DocumentError(f"mapping key {shown!r} is not a string{_where(key_node)}")
            if key_node.value in seen:
                raise _DocumentError(f"duplicate key {key_node.value!r}{_where(key_node)}")
            seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _where(node: yaml.Node) -> str:
    mark = getattr(node, "start_mark", None)
    if mark is None:
        return ""
    return f" (line {mark.line + 1}, column {mark.column + 1})"


def decode_strict_yaml(text: str) -> Any:
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        raise _DocumentError(f"invalid YAML: {_yaml_message(exc)}") from None
    except yaml.YAMLError as exc:
        raise _DocumentError(f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def _yaml_message(exc: yaml.MarkedYAMLError) -> str:
    text = " ".join(p for p in (exc.context, exc.problem) if p)
    mark = exc.problem_mark or exc.context_mark
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return text or str(exc)
