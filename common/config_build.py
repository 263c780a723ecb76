"""Typed dataclasses from a config tree (a dict): strict keys, types, choices and value ranges.

Generic: no package's config type is known here. `common.config_tree` reads the YAML files into the tree and
re-exports its public names (callers import them from there):

    cfg = build(SomeDataclass, tree["section"], "section.")    # ConfigError naming the dotted path

An unknown key, a key that is not a string, a wrong type, NaN where a number is expected, or a value outside a
field's `choices` or `value_range` metadata raises `ConfigError`. A float field also takes a string that Python's
`float()` parses: YAML 1.1 reads `1e-9` (no dot) as a string. A dataclass may list keys it no longer has in a class
attribute `LEGACY_KEYS = {"key": "why"}`: they are accepted, ignored and logged once (old run directories stay
loadable).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
import typing
from typing import Any

log = logging.getLogger("config")


class ConfigError(ValueError):
    """A configuration problem; its message names the dotted path (or file) at fault."""


def choices(*values: Any) -> dict:
    """Field metadata restricting a field to `values`: `field(default=..., metadata=choices("a", "b"))`."""
    return {"choices": values}


@dataclasses.dataclass(frozen=True)
class Range:
    """An interval of numbers (see `value_range`); a bound of None is no bound. Infinities and NaN are never in it."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    why: str = ""

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):  # (an int may be too large for a float)
            return False
        if self.min is not None and (value <= self.min if self.min_open else value < self.min):
            return False
        return self.max is None or (value < self.max if self.max_open else value <= self.max)

    def __str__(self) -> str:
        def text(bound: float) -> str:  # an int bound in full (2**32 - 1 is not 4.29497e+09)
            return str(bound) if isinstance(bound, int) else f"{bound:g}"

        if self.min is not None and self.max is not None:
            left, right = "(" if self.min_open else "[", ")" if self.max_open else "]"
            return f"in {left}{text(self.min)}, {text(self.max)}{right}"
        if self.min is not None:
            return f"{'>' if self.min_open else '>='} {text(self.min)}"
        if self.max is not None:
            return f"{'<' if self.max_open else '<='} {text(self.max)}"
        return "finite"


# The largest size or count a config takes where it becomes an int32 tensor (a shape, a length, a batch's tokens).
MAX_INT32 = 2**31 - 1


def value_range(
    min: float | None = None,
    max: float | None = None,
    *,
    min_open: bool = False,
    max_open: bool = False,
    why: str = "",
) -> dict:
    """Field metadata restricting a number (each number, for a list) to an interval, finite:
    `field(default=0.1, metadata=value_range(0, 1, max_open=True))` is [0, 1). None (an optional field) passes.
    `why`, if given, ends the error message in parentheses."""
    return {"range": Range(min, max, min_open, max_open, why)}


def _type_ok(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Checks `value` against a field annotation; returns (ok, converted value)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if float in options and (number := _parse_float(value)) is not None:
            return True, number  # before `str`: mask_fill "-1e9" (YAML 1.1 reads it as a string) is a number
        for option in options:
            ok, converted = _type_ok(value, option)
            if ok:
                return True, converted
        return False, value
    if annotation is type(None):
        return value is None, value
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            return False, value
        items = [_type_ok(v, item_type) for v in value]
        return all(ok for ok, _ in items), [v for _, v in items]
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        number = _parse_float(value)
        return number is not None, value if number is None else number
    if annotation is str:
        return isinstance(value, str), value
    raise TypeError(f"unsupported annotation {annotation!r}")


def _parse_float(value: Any) -> float | None:
    """A string Python's `float()` reads (YAML 1.1 leaves `1e-9` and `1e-3` strings) as that float, else None."""
    if not isinstance(value, str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _numbers(value: Any, dotted: str):
    """(dotted path, number) of `value`, or of each number in a (nested) list, e.g. "data.bucket_boundaries[2]"."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{dotted}[{index}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield dotted, value


def check_value(dotted: str, value: Any, field: dataclasses.Field) -> None:
    """Refuses NaN anywhere in `value`, and a value outside the field's `choices` or `value_range` metadata."""
    allowed = field.metadata.get("choices")
    if allowed and value not in allowed:
        raise ConfigError(f"{dotted}: {value!r} is not one of {', '.join(map(str, allowed))}")
    interval = field.metadata.get("range")
    for where, number in _numbers(value, dotted):
        if isinstance(number, float) and math.isnan(number):
            raise ConfigError(f"{where}: expected a number, got NaN")
        if interval is not None and number not in interval:
            finite = (
                " and finite"
                if isinstance(number, float) and math.isinf(number) and interval.max is None
                else ""
            )
            why = f" ({interval.why})" if interval.why else ""
            raise ConfigError(f"{where}: must be {interval}{finite}, got {number!r}{why}")


def check_fields(instance: Any, path: str = "") -> None:
    """`check_value` on every field of a dataclass built without `build` (nested dataclasses too)."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, f"{path}{field.name}.")
        else:
            check_value(f"{path}{field.name}", value, field)


def _describe(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def build(cls: type, tree: Any, path: str = ""):
    """A `cls` dataclass from a dict, checking keys, types, choices and ranges; nested dataclasses recursively.

    Args:
      cls: the dataclass.
      tree: its values (missing keys keep their defaults).
      path: the dotted prefix for messages, e.g. "data.".
    """
    if not isinstance(tree, dict):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: expected a mapping, got {type(tree).__name__}")
    section = path.rstrip(".") or "the top level"
    for key in tree:
        if not isinstance(key, str):
            raise ConfigError(
                f"config keys must be strings: {section} has the key {key!r} ({type(key).__name__}); "
                "quote it if it is meant as a name"
            )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    legacy = getattr(cls, "LEGACY_KEYS", {})
    for key in sorted(set(tree) & set(legacy) - set(fields)):
        log.warning("ignoring the obsolete config key %s%s: %s", path, key, legacy[key])
    tree = {key: value for key, value in tree.items() if key in fields or key not in legacy}
    unknown = sorted(set(tree) - set(fields))
    if unknown:
        import difflib

        known = ", ".join(sorted(fields))
        close = difflib.get_close_matches(str(unknown[0]), sorted(fields), n=1)
        meant = f"did you mean {path}{close[0]}? " if close else ""
        raise ConfigError(
            f"unknown config key {path}{unknown[0]} ({meant}known keys of {path[:-1] or 'top level'}: {known})"
        )
    kwargs = {}
    for name, value in tree.items():
        dotted = f"{path}{name}"
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            # an empty section (`train:` with its keys commented out): its defaults
            kwargs[name] = build(annotation, {} if value is None else value, f"{dotted}.")
            continue
        ok, converted = _type_ok(value, annotation)
        if not ok:
            # YAML 1.1 reads no/yes/on/off as booleans: Norwegian's language code `no` among them
            quote = (
                " (YAML reads no, yes, on and off as booleans: quote it, e.g. 'no')"
                if isinstance(value, bool)
                else ""
            )
            raise ConfigError(
                f"{dotted}: expected {_describe(annotation)}, got {type(value).__name__} {value!r}{quote}"
            )
        check_value(dotted, converted, fields[name])
        kwargs[name] = converted
    return cls(**kwargs)
