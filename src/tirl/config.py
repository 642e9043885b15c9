"""Typed configs: nested dataclasses loaded from YAML, with dotted overrides from the command line.

A config schema is a tree of dataclasses with annotated fields. `load_config` builds one in
three layers -- the dataclass defaults, then a YAML file, then overrides like `rl.lr=1e-4` --
and checks every value against its annotation on the way in, so a typo or a wrong type fails at
startup with one line naming the file or override, the dotted key, the value and what was
expected. A dataclass may define `validate(self)` for cross-field rules (ranges, orderings); it
runs after construction, for nested configs too, and raises `ConfigError`. Two class attributes
keep old configs readable: `MOVED_KEYS` (old key -> where it lives now: the old key is refused
with that hint in one line) and `SHORTHAND` (the field a plain value for the whole section sets:
`protocol: cir_fences` reads as `protocol: {name: cir_fences}`).

Annotations understood: bool, int, float, str, `X | None` and other unions (tried in order),
`Literal[...]`, Enum subclasses (by value), `list[T]`, `tuple[T, ...]`, fixed `tuple[A, B]`,
`dict[str, T]`, nested dataclasses and `Any` (unchecked). An int field also takes an integral
float (`1e3`). Anything else is a programming error (TypeError), not a user error.

Every value is also checked against what no field can want: a float must be finite (no NaN or
infinity), an int must fit in 64 bits (it ends up in torch or C), a string must not hold a NUL
character (it ends up in a path or a C API). Fields declared with `setting(default, range, doc)`
carry their documented range ("[0, 1)", "> 0", ">= 1": for a list of numbers, each item's) and
an optional `check` function, both applied on load, and their doc, which `describe` lists (so
`tirl config --keys` prints every key with its type, default, range and meaning).

Parsing is bounded, so that a mistaken or hostile input is one line rather than a
RecursionError, Python's int-conversion ValueError or minutes of parsing: a config file holds at
most 10 MB, YAML nests at most 100 deep, an integer is at most 100 characters long (64 bits
need 20), aliases expand to at most a million values and may not hold themselves, and a tagged
value its tag cannot read (`!!int abc`) is an error of that file or override.

Not covered: includes or inheritance between YAML files, environment-variable interpolation,
Path fields. Schemas must live at module level so `typing.get_type_hints` can resolve them.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import math
import re
import types
import typing
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar, Union

import yaml

from tirl.errors import ConfigError
from tirl.plugins import load_plugins

T = TypeVar("T")

INT64 = (-(2**63), 2**63 - 1)

# PyYAML follows YAML 1.1, where `1e-4` (no dot in the mantissa) is a string, not a float.
# Strings of this shape are accepted as numbers, because that is what anyone writing them means.
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclasses.dataclass(frozen=True)
class Range:
    """An interval a number must lie in, written as in the docs: "> 0", ">= 1", "<= 1", "[0, 1)",
    "(0, 1]". `None` bounds are open-ended."""

    text: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @classmethod
    def parse(cls, text: str) -> Range:
        t = text.strip()
        for op in (">=", "<=", ">", "<"):
            if t.startswith(op):
                bound = float(t[len(op) :])
                if op[0] == ">":
                    return cls(text, low=bound, low_open=op == ">")
                return cls(text, high=bound, high_open=op == "<")
        m = re.fullmatch(r"([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])", t)
        if not m:
            raise TypeError(f"cannot read range {text!r}; write e.g. '> 0', '>= 1' or '[0, 1)'")
        return cls(text, float(m[2]), float(m[3]), m[1] == "(", m[4] == ")")

    def __contains__(self, x: float) -> bool:
        if self.low is not None and (x < self.low or (self.low_open and x == self.low)):
            return False
        return not (
            self.high is not None and (x > self.high or (self.high_open and x == self.high))
        )

    def __str__(self) -> str:
        return self.text


def setting(
    default: Any = dataclasses.MISSING,
    range: str | None = None,  # noqa: A002 - the word the docs use
    doc: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    check: Any = None,
) -> Any:
    """A config field with its documented `range` (numbers), `doc` and optional `check(value)`
    returning an error text or None. `factory` builds a mutable default (lists, sections)."""
    meta = {"doc": doc, "range": Range.parse(range) if range else None, "check": check}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Build `cls` from its defaults, then the YAML file at `path`, then `key.sub=value` overrides.
    A config with a `plugins` field imports the plugins it lists first (`tirl.plugins`)."""
    data = _read_yaml(Path(path)) if path is not None else {}
    data = apply_overrides(data, overrides)
    try:
        if "plugins" in {f.name for f in dataclasses.fields(cls)}:
            # before the config is checked: its keys may name what the plugins register
            plugins = load_plugins(data.get("plugins"), Path(path).parent if path else None)
            if plugins:  # with each file's path absolute, as a saved copy must hold it
                data = {**data, "plugins": plugins}
        return from_dict(cls, data)
    except ConfigError as e:
        source = _source(e.key, path, overrides)
        raise ConfigError(f"{source}: {e}" if source else str(e), e.key) from None


def from_dict(cls: type[T], data: Mapping, where: str = "") -> T:
    """Build dataclass `cls` from plain data, strictly: unknown keys, wrong types and missing
    required fields are ConfigErrors. `where` is the dotted prefix of `data` in a larger config."""
    return _build(cls, data, where, base=None)


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One config key as `describe` lists it."""

    key: str
    type: str
    default: Any
    range: str
    doc: str


def describe(cls: type, where: str = "") -> list[KeyDoc]:
    """Every leaf key of schema `cls`, in field order, with its type, default, range and doc."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = _join(where, f.name)
        tp = hints[f.name]
        section = next((a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)), None)
        if section is not None and typing.get_origin(tp) is not list:
            rows.append(KeyDoc(key, "section", None, "", f.metadata.get("doc", "")))
            rows += describe(section, key)
            continue
        bounds = f.metadata.get("range")
        default = _default(f)
        rows.append(
            KeyDoc(
                key,
                _describe(tp),
                _plain(default) if dataclasses.is_dataclass(default) else default,
                str(bounds) if bounds else "",
                f.metadata.get("doc", ""),
            )
        )
    return rows


def to_dict(obj: Any) -> dict:
    """A dataclass as plain data for `yaml.safe_dump`: enums become values, tuples lists."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        raise TypeError(f"to_dict expects a dataclass instance, got {type(obj).__name__}")
    return _plain(obj)


def dump_yaml(obj: Any, path: str | Path) -> None:
    """Write the resolved config `obj` to `path`, in field order, loadable by `load_config`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(obj), sort_keys=False))


def apply_overrides(data: Mapping, overrides: Sequence[str]) -> dict:
    """Return a copy of `data` with each `a.b.c=value` set (value parsed by yaml.safe_load).

    Malformed overrides are ConfigErrors here; keys missing from the schema are caught when the
    result goes through `from_dict`, and `load_config` then names the override.
    """
    data = copy.deepcopy(dict(data))
    for text in overrides:
        key, raw = _split_override(text)
        try:
            value = _parse_yaml(raw)
        except _TooBig as e:
            raise ConfigError(f"override {_show(text)}: {e.problem}") from None
        except yaml.YAMLError as e:
            why = f" ({e.problem})" if getattr(e, "problem", None) else ""
            raise ConfigError(
                f"override {_show(text)}: cannot parse {_show(raw)} as a YAML value{why}"
            ) from None
        *parents, last = _key_steps(key)
        node = data
        for i, part in enumerate(parents):
            if isinstance(part, int):  # an item of a list the data already holds
                node = node[part]
            else:
                if node.get(part) is None:  # absent, or an optional section set to null
                    node[part] = {}
                node = node[part]
            nxt = (parents + [last])[i + 1]
            want = list if isinstance(nxt, int) else dict
            if not isinstance(node, want) or (want is list and not -len(node) <= nxt < len(node)):
                section = _steps_text(parents[: i + 1])
                what = f"a list with an item {nxt}" if want is list else "a section"
                raise ConfigError(f"override {_show(text)}: {section} is {_show(node)}, not {what}")
        node[last] = value
    return data


def _key_steps(key: str) -> list[str | int]:
    """`data.train[0].path` -> ["data", "train", 0, "path"] (list items by position)."""
    steps: list[str | int] = []
    for part in key.split("."):
        name, *indices = part.split("[")
        if name:
            steps.append(name)
        for index in indices:
            digits = index[:-1].lstrip("-")  # isdecimal: what int() reads ("²" is a digit too)
            if not index.endswith("]") or not digits.isdecimal() or not name:
                raise ConfigError(f"override key {_show(key)}: write list items as name[0]")
            if len(digits) > MAX_INT_CHARS:
                raise ConfigError(f"override key {_show(key)}: a list index that long is no item")
            steps.append(int(index[:-1]))
    return steps


def _steps_text(steps: list[str | int]) -> str:
    return "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps).lstrip(".")


def _split_override(text: str) -> tuple[str, str]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or "" in key.split("."):
        raise ConfigError(
            f"override {_show(text)}: expected key=value with a dotted key, e.g. rl.lr=1e-4"
        )
    return key, raw


MAX_CONFIG_BYTES = 10 * 2**20
MAX_YAML_DEPTH = 100
MAX_INT_CHARS = 100  # 64 bits need 20; far below Python's own limit on int("...") (4300)
MAX_YAML_VALUES = 1_000_000  # with aliases expanded: "a billion laughs" is refused


class _TooBig(yaml.MarkedYAMLError):
    """YAML past one of the parsing limits above; its `problem` names the limit."""

    def __init__(self, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)


class _ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader, bounded (see the module docstring), and refusing a mapping that
    names a key twice (PyYAML keeps the last value silently, so a config's second `lr:` would
    win without a word)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._values = 0  # values composed so far, each alias counting what it stands for
        self._open: set[str] = set()  # anchors whose node is still being composed
        self._sizes: dict[str, int] = {}  # anchor -> values its node holds

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise _TooBig(
                    f"the alias *{event.anchor} is inside its own anchor", event.start_mark
                )
            self._count(self._sizes.get(event.anchor, 0), event)
            return super().compose_node(parent, index)
        if self._depth >= MAX_YAML_DEPTH:
            raise _TooBig(
                f"nested deeper than {MAX_YAML_DEPTH} levels, the limit", event.start_mark
            )
        anchor, before = event.anchor, self._values
        self._count(1, event)
        self._depth += 1
        self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor)
            self._sizes[anchor] = self._values - before

    def _count(self, values: int, event) -> None:
        self._values += values
        if self._values > MAX_YAML_VALUES:
            raise _TooBig(f"more than {MAX_YAML_VALUES:,} values, the limit", event.start_mark)

    def construct_object(self, node, deep=False):
        """A tagged value its tag cannot read (`!!int abc`, `!!bool maybe`) fails inside
        PyYAML's constructors with a plain ValueError, KeyError, ...: make it a YAML error."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise yaml.constructor.ConstructorError(
                None, None, f"{node.value!r} is not a valid {tag}", node.start_mark
            ) from None

    def construct_int(self, node):
        if len(str(node.value)) > MAX_INT_CHARS:
            limit = f"longer than {MAX_INT_CHARS} characters, the limit"
            raise _TooBig(f"an integer {limit}", node.start_mark)
        return self.construct_yaml_int(node)

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                break  # PyYAML's own check below refuses it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_int)


def _parse_yaml(text: str) -> Any:
    """`text` as YAML data, within the limits; raises yaml.YAMLError (`_TooBig` for a limit)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader


def _read_yaml(path: Path) -> dict:
    try:
        with path.open("rb") as f:  # at most one byte past the limit: /dev/zero ends too
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{_shown_path(path)}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{_shown_path(path)}: is a folder, not a config file") from None
    except (OSError, ValueError) as e:  # permission, a name too long, a NUL in the path
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"{_shown_path(path)}: cannot read the config file: {reason}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        limit = MAX_CONFIG_BYTES // 2**20
        raise ConfigError(f"{_shown_path(path)}: larger than {limit} MB, the limit for a config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); is it a YAML file?") from None
    try:
        data = _parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "" if isinstance(e, _TooBig) else "invalid YAML: "
        raise ConfigError(f"{where}: {kind}{problem}") from None
    if data is None:  # an empty file sets nothing
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {_show(data)}")
    return data


def _shown_path(path: Path) -> str:
    text = str(path)
    return _show(text) if len(text) > 300 or "\0" in text else text


def _source(key: str | None, path: str | Path | None, overrides: Sequence[str]) -> str | None:
    """Which input an error at `key` came from: the last override that set that key, a section
    containing it, or (for a section's validate()) something inside it; else the file."""
    if key is not None:
        for text in reversed(overrides):
            okey = _split_override(text)[0]
            inside = key.startswith((okey + ".", okey + "["))
            if key == okey or inside or (key and okey.startswith(key + ".")):
                return f"override {_show(text)}"
    return str(path) if path is not None else None


def _build(cls: type[T], data: Any, where: str, base: Any) -> T:
    """Construct `cls` from mapping `data`; fields not in `data` come from `base` if given (the
    parent's default instance, so a `default_factory` with custom values survives a partial
    YAML section), else from the dataclass's own defaults."""
    if not isinstance(data, Mapping):
        _fail(where or "config", data, cls)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    moved = getattr(cls, "MOVED_KEYS", {})
    for name in data:
        if name in moved:
            key = _join(where, name)
            raise ConfigError(f"{key} is now {moved[name]}", key)
        if name not in fields:
            key = _join(where, name)
            raise ConfigError(f"unknown key {key!r}{_suggest(str(name), fields, where)}", key)
    kwargs = {}
    for name, f in fields.items():
        key = _join(where, name)
        if name in data:
            inner = getattr(base, name) if base is not None else _default(f)
            kwargs[name] = _convert(hints[name], data[name], key, inner)
            _check_setting(f, kwargs[name], key)
        elif base is not None:
            kwargs[name] = getattr(base, name)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key {key!r}", key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError as e:
            # A key inside this section that the rule named (data.train[0].source) is kept,
            # so load_config can say which override or file set it.
            key = e.key if e.key and e.key.startswith(where) else where
            raise ConfigError(f"{where}: {e}" if where else str(e), key) from None
    return obj


def _check_setting(f: dataclasses.Field, value: Any, key: str) -> None:
    """The field's documented range (each item's, for a list) and its own check."""
    bounds = f.metadata.get("range")
    if bounds is not None and value is not None:
        items = value if isinstance(value, (list, tuple)) else [value]
        for i, item in enumerate(items):
            if isinstance(item, (int, float)) and item not in bounds:
                where = key if items is not value else f"{key}[{i}]"
                raise ConfigError(f"{where} must be {_range_words(bounds)}, got {_show(item)}", key)
    check = f.metadata.get("check")
    if check is not None and value is not None and (problem := check(value)):
        raise ConfigError(f"{key} {problem}, got {_show(value)}", key)


def _range_words(bounds: Range) -> str:
    text = str(bounds)
    return f"in {text}" if text[0] in "[(" else text


def _convert(tp: Any, value: Any, key: str, base: Any = None) -> Any:
    """Check `value` against annotation `tp` and return it in that type."""
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        shorthand = getattr(tp, "SHORTHAND", None)
        if shorthand is not None and not isinstance(value, Mapping):
            value = {shorthand: value}  # `protocol: cir_fences` = `protocol: {name: cir_fences}`
        return _build(tp, value, key, base if isinstance(base, tp) else None)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, key, base)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1 and errors[0].key != key:  # the problem is deeper inside
            raise errors[0]
        _fail(key, value, tp)
    if origin is Literal:
        for allowed in args:
            if value == allowed and type(value) is type(allowed):
                return allowed
        _fail(key, value, tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except (ValueError, TypeError):
            _fail(key, value, tp)
    if tp is bool:
        return value if isinstance(value, bool) else _fail(key, value, tp)
    if tp in (int, float):
        number = value
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            number = float(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            _fail(key, value, tp)
        if not math.isfinite(number):
            raise ConfigError(f"{key} must be a finite number, got {_show(value)}", key)
        if tp is int and (isinstance(number, int) or number.is_integer()):
            number = int(number)
            if not INT64[0] <= number <= INT64[1]:
                raise ConfigError(f"{key} must fit in 64 bits, got {_show(value)}", key)
            return number
        if tp is float:
            return float(number)
        _fail(key, value, tp)
    if tp is str:
        if not isinstance(value, str):
            _fail(key, value, tp)
        if "\0" in value:
            raise ConfigError(f"{key} must not contain a NUL character, got {_show(value)}", key)
        return value
    if tp is type(None):
        return value if value is None else _fail(key, value, tp)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            _fail(key, value, tp)
        if origin is list or (args and args[-1] is Ellipsis) or not args:
            item = args[0] if args else Any
            items = [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
            return items if origin is list else tuple(items)
        if len(value) != len(args):
            _fail(key, value, tp)
        return tuple(
            _convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if origin is dict:
        if not isinstance(value, Mapping):
            _fail(key, value, tp)
        key_tp, value_tp = args or (Any, Any)
        return {
            _convert(key_tp, k, key): _convert(value_tp, v, _join(key, str(k)))
            for k, v in value.items()
        }
    raise TypeError(f"config field {key!r}: unsupported annotation {tp!r}")


def _describe(tp: Any) -> str:
    """What a value of annotation `tp` must be, as the end of 'x must be ...'."""
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(_show(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(_show(m.value) for m in tp)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} items"
    if dataclasses.is_dataclass(tp) or origin is dict:
        return "a mapping of keys"
    names = {bool: "true or false", int: "an int", float: "a float", str: "a string"}
    names.update({type(None): "null", list: "a list", tuple: "a list"})
    return names.get(origin, repr(tp))


def _fail(key: str, value: Any, tp: Any) -> NoReturn:
    raise ConfigError(f"{key} must be {_describe(tp)}, got {_show(value)}", key)


def _show(value: Any) -> str:
    """A value as the user would write it in YAML, kept short."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _suggest(name: str, fields: Mapping[str, Any], where: str) -> str:
    close = difflib.get_close_matches(name, list(fields), n=1)
    if close:
        return f" (did you mean {_join(where, close[0])!r}?)"
    return f" (valid keys: {', '.join(fields)})"


def _join(where: str, name: Any) -> str:
    return f"{where}.{name}" if where else str(name)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, enum.Enum):
        return _plain(obj.value)
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------------------------
# Checks that config sections of several packages share


def path_problem(path: str) -> str | None:
    """Why `path` cannot name a file or folder, or None."""
    if not path.strip():
        return "must not be empty"
    return "must be at most 4096 bytes" if len(path.encode()) > 4096 else None


def plain_values_problem(params: dict[str, Any]) -> str | None:
    """Hyper-parameters are plain YAML scalars (or lists of them), numbers finite."""

    def plain(v: Any) -> bool:
        if isinstance(v, list):
            return all(plain(x) for x in v)
        if isinstance(v, float):
            return v == v and abs(v) != float("inf")
        return v is None or isinstance(v, (bool, int, str))

    bad = [k for k, v in params.items() if not plain(v)]
    if bad:
        return f"must map names to numbers, strings or lists of them ({bad[0]!r} does not)"
    return None


def keyword_params(fn: Any, reserved: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    """(the keyword parameters `fn` takes besides `reserved`, whether it takes any keyword)."""
    import inspect

    names, any_keyword = [], False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            any_keyword = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in reserved:
            names.append(p.name)
    return names, any_keyword


def check_keyword_params(
    key: str,
    params: dict[str, Any],
    fn: Any,
    what: str,
    reserved: tuple[str, ...] = (),
    dedicated: dict[str, str] | None = None,
) -> None:
    """ConfigError unless every name in `params` is a keyword parameter of `fn` that no
    dedicated config field already sets."""
    names, any_keyword = keyword_params(fn, reserved)
    for name in params:
        if dedicated and name in dedicated:
            raise ConfigError(f"{key}.{name}: set {dedicated[name]} instead", f"{key}.{name}")
        if name in names or (any_keyword and name not in reserved):
            continue
        accepted = [n for n in names if not dedicated or n not in dedicated]
        takes = f"accepted: {', '.join(accepted)}" if accepted else "it takes none"
        raise ConfigError(f"{key}.{name} is not a parameter of {what} ({takes})", f"{key}.{name}")
