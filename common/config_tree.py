"""YAML config files -> typed dataclasses: inheritance, `--set` overrides, strict validation.

Generic: no package's config type is known here. `nmt.config` builds the whole `Config` with it; the `data`
CLIs build only their `data:` section (`build(DataConfig, tree.get("data", {}), "data.")`).

    tree = load_tree("tiny.yaml", ["data.vocab_size=4000"])   # a dict, inheritance and overrides applied
    cfg = build(SomeDataclass, tree["section"], "section.")    # ConfigError naming the dotted path

A YAML file may inherit from another with `base: other.yaml` (resolved next to the file, then in `configs/`);
`--set section.key=value` overrides are parsed as YAML scalars. An unknown key, a wrong type or a value outside a
field's `choices` metadata raises `ConfigError`. A dataclass may list keys it no longer has in a class attribute
`LEGACY_KEYS = {"key": "why"}`: they are accepted, ignored and logged once (old run directories stay loadable).
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from pathlib import Path
from typing import Any

import yaml

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
log = logging.getLogger("config")


class ConfigError(ValueError):
    """A configuration problem; its message names the dotted path (or file) at fault."""


def choices(*values: Any) -> dict:
    """Field metadata restricting a field to `values`: `field(default=..., metadata=choices("a", "b"))`."""
    return {"choices": values}


def resolve_config_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """A path as given, else next to `relative_to`, else in configs/ (with or without `.yaml`)."""
    name = Path(name)
    candidates = [name]
    if relative_to is not None:
        candidates.append(relative_to / name)
    candidates += [CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ConfigError(f"config file not found: {name} (looked in {', '.join(str(c) for c in candidates)})")


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in {path}: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load_file(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config inheritance loop: {' -> '.join(str(p) for p in (*seen, path))}")
    tree = _read_yaml(path)
    base = tree.pop("base", None)
    if base is None:
        return tree
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base: expected a file name, got {type(base).__name__}")
    parent = _load_file(resolve_config_path(base, relative_to=path.parent), (*seen, path))
    return _merge(parent, tree)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], value parsed as a YAML scalar)."""
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    dotted, raw = text.split("=", 1)
    keys = dotted.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {dotted}: cannot parse value {raw!r}: {err}") from err
    return keys, value


def load_tree(name: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """The config file `name` (with inheritance; None = empty) with `--set` overrides applied, as a dict."""
    tree = _load_file(resolve_config_path(name)) if name is not None else {}
    for text in overrides:
        keys, value = parse_override(text)
        node = tree
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {'.'.join(keys)}: {key} is not a section")
            node = child
        node[keys[-1]] = value
    return tree


def _type_ok(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Checks `value` against a field annotation; returns (ok, converted value)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
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
        return False, value
    if annotation is str:
        return isinstance(value, str), value
    raise TypeError(f"unsupported annotation {annotation!r}")


def _describe(annotation: Any) -> str:
    return str(annotation).replace("typing.", "").replace("<class '", "").replace("'>", "")


def build(cls: type, tree: Any, path: str = ""):
    """A `cls` dataclass from a dict, checking keys, types and choices; nested dataclasses recursively.

    Args:
      cls: the dataclass.
      tree: its values (missing keys keep their defaults).
      path: the dotted prefix for messages, e.g. "data.".
    """
    if not isinstance(tree, dict):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: expected a mapping, got {type(tree).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    legacy = getattr(cls, "LEGACY_KEYS", {})
    for key in sorted(set(tree) & set(legacy) - set(fields)):
        log.warning("ignoring the obsolete config key %s%s: %s", path, key, legacy[key])
    tree = {key: value for key, value in tree.items() if key in fields or key not in legacy}
    unknown = sorted(set(tree) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(
            f"unknown config key {path}{unknown[0]} (known keys of {path[:-1] or 'top level'}: {known})"
        )
    kwargs = {}
    for name, value in tree.items():
        dotted = f"{path}{name}"
        annotation = hints[name]
        if dataclasses.is_dataclass(annotation):
            kwargs[name] = build(annotation, value, f"{dotted}.")
            continue
        ok, converted = _type_ok(value, annotation)
        if not ok:
            raise ConfigError(
                f"{dotted}: expected {_describe(annotation)}, got {type(value).__name__} {value!r}"
            )
        allowed = fields[name].metadata.get("choices")
        if allowed and converted not in allowed:
            raise ConfigError(f"{dotted}: {converted!r} is not one of {', '.join(map(str, allowed))}")
        kwargs[name] = converted
    return cls(**kwargs)


def add_set_argument(parser) -> None:
    """`--set section.key=value [section.key=value ...]`, repeatable; collected in `args.overrides`."""
    parser.add_argument(
        "--set",
        dest="overrides",
        nargs="+",
        action="extend",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override config values, e.g. --set data.vocab_size=4000 data.batch_tokens=2048 (repeatable)",
    )
