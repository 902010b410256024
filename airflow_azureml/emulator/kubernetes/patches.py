"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as the API server applies them to an object."""

from __future__ import annotations

import copy
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]] if path else []


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    if not parts:
        raise ValueError("the whole document cannot be the target of this operation")
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"path /{'/'.join(parts)} does not exist")
    return node, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    node, last = _parent(doc, parts) if parts else (None, "")
    if not parts:
        return doc
    if isinstance(node, dict) and last in node:
        return node[last]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node[int(last)]
    raise ValueError(f"path /{'/'.join(parts)} does not exist")


def _remove(doc: Any, parts: list[str]) -> Any:
    node, last = _parent(doc, parts)
    value = _get(doc, parts)
    if isinstance(node, dict):
        del node[last]
    else:
        del node[int(last)]
    return value


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return copy.deepcopy(value)
    node, last = _parent(doc, parts)
    if isinstance(node, dict):
        node[last] = copy.deepcopy(value)
    elif isinstance(node, list):
        if last == "-":
            node.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(node):
            node.insert(int(last), copy.deepcopy(value))
        else:
            raise ValueError(f"index {last!r} is out of range")
    else:
        raise ValueError(f"path /{'/'.join(parts)} does not exist")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test). Raises ValueError on failure."""
    if not isinstance(operations, list):
        raise ValueError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ValueError(f"invalid operation {op!r}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, parts, op.get("value"))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _get(doc, parts)
            if not parts:
                doc = copy.deepcopy(op.get("value"))
            else:
                _remove(doc, parts)
                doc = _add(doc, parts, op.get("value"))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise ValueError(f"test failed at {op['path']}")
        else:
            raise ValueError(f"unknown operation {kind!r}")
    return doc
