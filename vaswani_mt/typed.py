"""Typed dataclasses from plain mappings (YAML, JSON): the one builder of the package.

`from_mapping(cls, values)` fills `cls` field by field, nested dataclasses too, checking each value against its
field's annotation. Strict (a run config): an unknown key or a value of the wrong type raises `MappingError` naming
the dotted key. Lenient (a `metrics.json` written by another version): what does not fit keeps its default.

A leaf module: it imports nothing from the package.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any


class MappingError(ValueError):
    """A mapping that does not fit its dataclass; the message names the dotted key."""


def from_mapping(cls, values: Any, where: str = "", strict: bool = True, noun: str = "key"):
    """`cls` (a dataclass) from `values`. `where`: the dotted path of `values` (for messages); `noun`: what a key is
    called in them (e.g. "config key")."""
    if not isinstance(values, dict):
        if strict:
            raise MappingError(f"{where or 'the top level'} must be a mapping of keys to values, got {values!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in values.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in known:
            if strict:
                raise MappingError(f"unknown {noun} {dotted!r}{suggestion(str(key), known)}")
            continue
        nested = _dataclass_in(hints[key])
        if nested is not None and (value is not None or hints[key] is nested):  # a section: a mapping, or None
            kwargs[key] = from_mapping(nested, value, dotted, strict, noun)
        elif fits(value, hints[key]):
            kwargs[key] = float(value) if hints[key] is float else value
        elif strict:
            raise MappingError(f"{noun} {dotted!r} must be of type {type_name(hints[key])}, got {value!r}")
    return cls(**kwargs)


def suggestion(name: str, known: list[str]) -> str:
    """"; did you mean 'x'?" for the closest known name, else the list of known names."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"


def fits(value: Any, annotation: Any) -> bool:
    """Whether `value` is of the annotated type (an int is a float, a bool is not an int; generics by origin)."""
    if annotation is typing.Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        annotation = origin
    return isinstance(value, annotation)


def type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _dataclass_in(annotation: Any):
    """The dataclass of an annotation `D` or `D | None`, else None."""
    if dataclasses.is_dataclass(annotation):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        found = [arg for arg in typing.get_args(annotation) if dataclasses.is_dataclass(arg)]
        return found[0] if len(found) == 1 else None
    return None


__all__ = ["MappingError", "fits", "from_mapping", "suggestion", "type_name"]
