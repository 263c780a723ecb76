"""YAML config files -> typed dataclasses: inheritance, `--set` overrides, strict validation.

Generic: no package's config type is known here. `nmt.config` builds the whole `Config` with it; the `data`
CLIs build only their `data:` section (`build(DataConfig, tree.get("data", {}), "data.")`).

    tree = load_tree("tiny.yaml", ["data.vocab_size=4000"])   # a dict, inheritance and overrides applied
    cfg = build(SomeDataclass, tree["section"], "section.")    # ConfigError naming the dotted path

A YAML file may inherit from another with `base: other.yaml` (resolved next to the file, then in `configs/`);
`--set section.key=value` overrides are parsed as YAML scalars. An unknown key, a key that is not a string, a wrong
type, NaN where a number is expected, or a value outside a field's `choices` or `value_range` metadata raises
`ConfigError`; so does an unquoted number YAML 1.1 reads as another, in a file or `--set` (`010` is 8, octal;
`1:30` is 90, base 60). A float field also takes a string that Python's `float()` parses: YAML 1.1 reads `1e-9`
(no dot) as a string. A dataclass may list keys it no longer has in a class attribute
`LEGACY_KEYS = {"key": "why"}`: they are accepted, ignored and logged once (old run directories stay loadable).

This module reads the files into the tree; the typed building (`build`, `check_fields`, `check_value`,
`choices`, `value_range`, `Range`, `MAX_INT32`, `ConfigError`) is `common.config_build`'s, re-exported here.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml

from common.config_build import (  # noqa: F401 - re-exported: callers import them from here
    MAX_INT32,
    ConfigError,
    Range,
    build,
    check_fields,
    check_value,
    choices,
    value_range,
)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# What YAML 1.1 (PyYAML) reads as a number other than the one it looks like: 010 is 8 (octal), 1:30 is 90 (base 60).
YAML11_NUMBER = re.compile(r"[-+]?(0[0-7_]+|[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?)")
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


def _yaml11_reading(raw: str) -> str:
    """For an unquoted YAML scalar `raw` that YAML 1.1 reads as another number than it looks like (`YAML11_NUMBER`),
    what it reads and what to write instead, e.g. "YAML reads this as 90 (base 60): write the number ..."; else ""."""
    if not YAML11_NUMBER.fullmatch(raw):
        return ""
    value = yaml.safe_load(raw)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return ""
    # 07 or 00: octal, but the number it looks like
    if ":" not in raw and int(raw.replace("_", "")) == value:
        return ""
    kind = "base 60" if ":" in raw else "octal"
    return (
        f"YAML reads this as {value!r} ({kind}): write the number without leading zeros or colons (or quote it for "
        "a text value)"
    )


def resolve_config_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """A path as given (from the current directory), else in configs/ (with or without `.yaml`). With
    `relative_to` (a `base:` inside a config file), next to that file instead of the current directory."""
    name = Path(name)
    candidates = [name if relative_to is None else relative_to / name]
    candidates += [CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if name.is_dir():
        raise ConfigError(f"config file {name} is a directory: give a YAML file (e.g. configs/base.yaml)")
    known = sorted(path.stem for path in CONFIG_DIR.glob("*.yaml"))
    close = difflib.get_close_matches(name.name.removesuffix(".yaml"), known, n=3)
    hint = (
        f"; did you mean {' or '.join(str(CONFIG_DIR / f'{stem}.yaml') for stem in close)}?" if close else ""
    )
    raise ConfigError(
        f"config file not found: {name} (looked in {', '.join(str(c) for c in candidates)}){hint}"
    )


def _node_problem(text: str, path: Path) -> str:
    """What the YAML `text` of the file `path` means otherwise than it reads, as a message ("" if nothing). From the
    node tree (`yaml.compose`: nothing is constructed), in the file's order:
    - a key repeated in one mapping: `yaml.safe_load` keeps the last silently, so a second `train:` section at the
      end of a file replaced the whole first one (merge keys, `<<: *defaults`, may be overridden, as YAML means);
    - an unquoted number YAML 1.1 reads otherwise (`_yaml11_reading`): `max_minutes: 1:30:00` was 5400 minutes."""
    stack, seen_nodes = [(yaml.compose(text, Loader=yaml.SafeLoader), "")], set()
    while stack:
        node, dotted = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        children = []
        if isinstance(node, yaml.MappingNode):
            first_line = {}
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                children.append((value_node, f"{dotted}.{name}" if dotted else name))
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = (key_node.tag, key_node.value)
                if key in first_line:
                    return (
                        f"invalid YAML in {path}: found the key {key_node.value!r} twice (first on line "
                        f"{first_line[key] + 1}), again on line {key_node.start_mark.line + 1}"
                    )
                first_line[key] = key_node.start_mark.line
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, f"{dotted}[{index}]") for index, item in enumerate(node.value)]
        elif (
            node.style is None
            and node.tag in (_INT_TAG, _FLOAT_TAG)
            and (reading := _yaml11_reading(node.value))
        ):
            return f"{path}, line {node.start_mark.line + 1}: {dotted or 'the document'}: {node.value}: {reading}"
        # reversed: popped in the file's order, the first problem in the file is the one named
        stack.extend(reversed(children))
    return ""


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from err
    try:
        problem = _node_problem(text, path)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in {path}: {err}") from err
    if problem:
        raise ConfigError(problem)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def _merge(base: dict, override: dict, path: Path, dotted: str = "") -> dict:
    """`override` (the file `path`'s tree) over `base` (its base's), section by section. An empty section
    (``train:`` with its keys commented out) keeps the base's; anything else in place of a section is refused,
    naming the file."""
    merged = dict(base)
    for key, value in override.items():
        name = f"{dotted}{key}"
        if isinstance(merged.get(key), dict):
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{path}: {name}: expected a mapping (a section, as in its base:), got "
                    f"{type(value).__name__} {value!r}"
                )
            merged[key] = _merge(merged[key], value, path, f"{name}.")
        else:
            merged[key] = value
    return merged


def _load_file(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"config inheritance loop: {' -> '.join(str(p) for p in (*seen, path))}")
    tree = _read_yaml(path)
    if "base" not in tree:
        return tree
    # an empty `base:` (None, "") is refused as a file name: taken for no base, a run trained on the defaults
    base = tree.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base: expected a file name, got {base!r} ({type(base).__name__})")
    try:
        found = resolve_config_path(base, relative_to=path.parent)
    except ConfigError as err:
        # which file's base: is missing (in a chain a -> b -> missing, b's)
        raise ConfigError(f"{path}: base: {err}") from None
    parent = _load_file(found, (*seen, path))
    return _merge(parent, tree, path)


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
    if reading := _yaml11_reading(raw.strip()):
        raise ConfigError(f"--set {dotted.strip()}={raw.strip()}: {reading}")
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
