from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import pytest
import yaml

from tirl.config import (
    MAX_CONFIG_BYTES,
    ConfigError,
    apply_overrides,
    dump_yaml,
    from_dict,
    load_config,
    to_dict,
)


class Mode(Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclass
class RLConfig:
    lr: float = 1e-5
    steps: int = 100
    clip: float | None = None
    budget_schedule: tuple[tuple[float, int], ...] = ((0.0, 1),)

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")


@dataclass
class TaskConfig:
    kinds: list[Literal["product", "mod", "chain"]] = field(default_factory=lambda: ["product"])
    mode: Mode = Mode.FAST
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class RunConfig:
    name: str  # required: no default
    seed: int = 0
    debug: bool = False
    rl: RLConfig = field(default_factory=RLConfig)
    # a default that differs from TaskConfig's own defaults must survive a partial YAML section
    task: TaskConfig = field(default_factory=lambda: TaskConfig(kinds=["mod"]))

    def validate(self) -> None:
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")


def write(tmp_path, text: str):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


def error_of(path=None, overrides=("name=run",)) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(RunConfig, path, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_fill_every_field_not_given():
    cfg = load_config(RunConfig, overrides=["name=run"])
    assert cfg == RunConfig(name="run")
    assert cfg.task.kinds == ["mod"]


def test_yaml_sets_nested_fields_and_keeps_the_other_defaults(tmp_path):
    path = write(tmp_path, "name: a\nrl:\n  lr: 3.0e-4\ntask:\n  mode: slow\n")
    cfg = load_config(RunConfig, path)
    assert cfg.rl == RLConfig(lr=3e-4)
    assert cfg.task == TaskConfig(kinds=["mod"], mode=Mode.SLOW)


def test_overrides_beat_yaml(tmp_path):
    path = write(tmp_path, "name: a\nseed: 1\nrl:\n  lr: 0.1\n")
    cfg = load_config(RunConfig, path, ["rl.lr=1e-4", "name=b"])
    assert (cfg.name, cfg.seed, cfg.rl.lr) == ("b", 1, 1e-4)


def test_override_values_are_parsed_as_yaml_and_typed():
    cfg = load_config(
        RunConfig,
        overrides=[
            "name=run",
            "task.kinds=[product,chain]",
            "rl.budget_schedule=[[0,2],[0.5,3]]",
            "rl.clip=0",
            "task.mode=slow",
            "task.weights={product: 1, mod: 0.5}",
            "seed=1e3",
            "debug=true",
        ],
    )
    assert cfg.task.kinds == ["product", "chain"]
    assert cfg.rl.budget_schedule == ((0.0, 2), (0.5, 3))
    assert cfg.rl.clip == 0.0 and isinstance(cfg.rl.clip, float)
    assert cfg.task.mode is Mode.SLOW
    assert cfg.task.weights == {"product": 1.0, "mod": 0.5}
    assert cfg.seed == 1000 and isinstance(cfg.seed, int)
    assert cfg.debug is True
    assert load_config(RunConfig, overrides=["name=run", "rl.clip=null"]).rl.clip is None


def test_unknown_key_in_file_names_the_file_key_and_closest_key(tmp_path):
    path = write(tmp_path, "name: a\nrl:\n  lrr: 0.1\n")
    assert error_of(path) == f"{path}: unknown key 'rl.lrr' (did you mean 'rl.lr'?)"


def test_unknown_key_without_close_match_lists_the_valid_keys():
    message = error_of(overrides=["name=run", "rl.zzz=1"])
    assert message.startswith("override 'rl.zzz=1': unknown key 'rl.zzz'")
    assert "lr, steps, clip, budget_schedule" in message


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rl.lr=abc", "override 'rl.lr=abc': rl.lr must be a float, got 'abc'"),
        ("seed=1.5", "seed must be an int, got 1.5"),
        ("seed=true", "seed must be an int, got true"),
        ("debug=1", "debug must be true or false, got 1"),
        ("name=[a]", "name must be a string, got ['a']"),
        ("rl.clip=abc", "rl.clip must be a float or null, got 'abc'"),
        ("task.mode=medium", "task.mode must be one of 'fast', 'slow', got 'medium'"),
        ("task.weights={a: x}", "task.weights.a must be a float, got 'x'"),
        ("task.kinds=product", "task.kinds must be a list, got 'product'"),
        ("rl.budget_schedule=[[0,2,3]]", "rl.budget_schedule[0] must be a list of 2 items"),
        ("rl=5", "rl must be a mapping of keys, got 5"),
    ],
)
def test_wrong_type_names_the_key_the_value_and_what_was_expected(override, expected):
    message = error_of(overrides=["name=run", override])
    assert message.startswith(f"override {override!r}: ")
    assert expected in message


def test_literal_error_in_file_lists_the_allowed_values(tmp_path):
    path = write(tmp_path, "name: a\ntask:\n  kinds: [product, prod]\n")
    expected = f"{path}: task.kinds[1] must be one of 'product', 'mod', 'chain', got 'prod'"
    assert error_of(path) == expected


def test_missing_required_key():
    assert error_of(overrides=()) == "missing required key 'name'"


def test_validate_runs_on_nested_configs_with_the_dotted_prefix(tmp_path):
    message = error_of(overrides=["name=run", "rl.lr=-1"])
    assert message == "override 'rl.lr=-1': rl: lr must be > 0, got -1.0"
    path = write(tmp_path, "name: a\nseed: -2\n")
    assert error_of(path, overrides=()) == f"{path}: seed must be >= 0, got -2"


@pytest.mark.parametrize("override", ["rl.lr", "=3", "rl..lr=1", " =1", "seed=[1"])
def test_malformed_override_is_a_config_error(override):
    assert error_of(overrides=[override]).startswith(f"override {override!r}: ")


def test_override_through_a_scalar_is_a_config_error():
    with pytest.raises(ConfigError, match=r"override 'seed.x=1': seed is 3, not a section"):
        apply_overrides({"seed": 3}, ["seed.x=1"])


def test_apply_overrides_leaves_its_input_alone():
    data = {"rl": {"lr": 0.1}}
    assert apply_overrides(data, ["rl.lr=0.2", "task.mode=slow"]) == {
        "rl": {"lr": 0.2},
        "task": {"mode": "slow"},
    }
    assert data == {"rl": {"lr": 0.1}}


def test_invalid_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path, "name: a\nrl:\n  lr: [1, 2\n")
    assert error_of(path).startswith(f"{path}:4: invalid YAML: ")


DEEP = "[" * 3000 + "]" * 3000  # a RecursionError of ~3,000 lines before the limit
LONG = "1" * 5000  # past Python's int("...") limit (4,300 digits): a ValueError before


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (DEEP, "nested deeper than 100 levels, the limit"),
        (LONG, "an integer longer than 100 characters, the limit"),
        (
            "0x" + "f" * 5000,
            "an integer longer than 100 characters, the limit",
        ),  # an OverflowError before
        ("&x [*x]", "the alias *x is inside its own anchor"),  # a list holding itself
    ],
)
def test_parsing_limits_are_one_line_naming_the_override_or_file(tmp_path, value, words):
    message = error_of(overrides=["name=run", f"task.weights={value}"])
    assert message.startswith("override 'task.weights=") and message.endswith(words), message
    path = write(tmp_path, f"name: run\ntask:\n  weights: {value}\n")
    assert error_of(path, overrides=()) == f"{path}:3: {words}"


def test_aliases_that_expand_past_a_million_values_are_refused(tmp_path):
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]  # each line 10 times the last
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert error_of(path).endswith("more than 1,000,000 values, the limit")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("!!int abc", "'abc' is not a valid !!int"),  # a ValueError before
        ("!!bool maybe", "'maybe' is not a valid !!bool"),  # a KeyError
        ("!!timestamp x", "'x' is not a valid !!timestamp"),  # an AttributeError
        ("{[1]: 2}", "found unhashable key"),  # a TypeError (files only)
    ],
)
def test_a_value_its_yaml_tag_cannot_read_is_one_line(tmp_path, value, words):
    message = error_of(overrides=["name=run", f"seed={value}"])
    assert message.startswith("override 'seed=") and words in message, message
    path = write(tmp_path, f"name: run\nseed: {value}\n")
    assert error_of(path, overrides=()) == f"{path}:2: invalid YAML: {words}"


@pytest.mark.parametrize("index", ["1" * 5000, "²"])
def test_an_override_index_int_cannot_read_is_one_line(index):
    assert error_of(overrides=["name=run", f"task.kinds[{index}]=mod"]).startswith(
        "override key 'task.kinds["
    )


def test_a_config_file_past_the_size_limit_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    line = "- " + "x" * 1000 + "\n"
    path.write_text("name: run\nitems:\n" + line * (MAX_CONFIG_BYTES // len(line) + 1))
    assert error_of(path, overrides=()) == f"{path}: larger than 10 MB, the limit for a config"


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- a\n- b\n")
    assert error_of(path) == f"{path}: the top level must be a mapping of keys, got ['a', 'b']"


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.yaml"
    assert error_of(path) == f"{path}: no such config file"


def test_empty_file_sets_nothing(tmp_path):
    assert load_config(RunConfig, write(tmp_path, ""), ["name=run"]) == RunConfig(name="run")


def full_config() -> RunConfig:
    return RunConfig(
        name="run",
        seed=3,
        rl=RLConfig(lr=2e-6, clip=0.2, budget_schedule=((0.0, 2), (0.5, 3))),
        task=TaskConfig(kinds=["chain", "mod"], mode=Mode.SLOW, weights={"chain": 2.0}),
    )


def test_to_dict_is_plain_data():
    data = to_dict(full_config())
    assert data["task"]["mode"] == "slow"
    assert data["rl"]["budget_schedule"] == [[0.0, 2], [0.5, 3]]
    assert yaml.safe_load(yaml.safe_dump(data)) == data


def test_to_dict_then_from_dict_round_trips():
    cfg = full_config()
    assert from_dict(RunConfig, to_dict(cfg)) == cfg


def test_dump_yaml_then_load_config_round_trips(tmp_path):
    cfg = full_config()
    dump_yaml(cfg, tmp_path / "out" / "resolved.yaml")
    assert load_config(RunConfig, tmp_path / "out" / "resolved.yaml") == cfg


def test_an_override_reaches_into_a_list_item_by_position():
    data = {"data": {"train": [{"source": "a", "path": "x"}, {"source": "b"}]}}
    out = apply_overrides(data, ["data.train[1].weight=2", "data.train[0].path=y"])
    assert out["data"]["train"] == [{"source": "a", "path": "y"}, {"source": "b", "weight": 2}]
    assert apply_overrides(data, ["data.train[0]={source: c}"])["data"]["train"][0] == {
        "source": "c"
    }
    assert data["data"]["train"][0]["path"] == "x"  # the input is left alone


@pytest.mark.parametrize(
    "override, words",
    [
        ("data.train[2].path=y", "data.train is [{"),
        ("data.train[x].path=y", "write list items as name[0]"),
        ("data[0].path=y", "data is {"),
    ],
)
def test_an_item_the_list_does_not_have_is_a_config_error(override, words):
    data = {"data": {"train": [{"source": "a"}]}}
    with pytest.raises(ConfigError, match=r"^override ") as err:
        apply_overrides(data, [override])
    assert words in str(err.value)


@dataclass
class Entries:
    items: list[dict] = field(default_factory=list)

    def validate(self) -> None:
        if self.items and "source" not in self.items[0]:
            raise ConfigError("items[0].source is missing", "entries.items[0].source")


@dataclass
class WithEntries:
    entries: Entries = field(default_factory=Entries)


def test_a_rule_naming_a_key_inside_its_section_is_traced_to_the_override():
    """A section's validate() that names a deeper key (entries.items[0].source) is reported
    against the override that set it, not the config file."""
    with pytest.raises(ConfigError) as err:
        load_config(WithEntries, None, ["entries.items=[{weight: 1}]"])
    assert str(err.value).startswith("override 'entries.items=[{weight: 1}]': ")
    assert err.value.key == "entries.items[0].source"


@dataclass
class Shape:
    SHORTHAND = "name"  # `shape: box` reads as `shape: {name: box}`
    MOVED_KEYS = {"size": "shape.scale"}  # unannotated: class constants, not fields

    name: str = "ball"
    scale: float = 1.0


@dataclass
class WithShape:
    MOVED_KEYS = {"shape_scale": "shape.scale"}

    shape: Shape = field(default_factory=Shape)


def test_a_plain_value_for_a_section_with_a_shorthand_sets_its_shorthand_field(tmp_path):
    cfg = load_config(WithShape, write(tmp_path, "shape: box\n"))
    assert cfg.shape == Shape(name="box", scale=1.0)
    assert load_config(WithShape, None, ["shape=cube"]).shape.name == "cube"
    assert load_config(WithShape, None, ["shape.scale=2"]).shape == Shape("ball", 2.0)
    with pytest.raises(ConfigError, match="shape.name must be a string, got 3"):
        load_config(WithShape, None, ["shape=3"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("shape_scale=2", "override 'shape_scale=2': shape_scale is now shape.scale"),
        ("shape.size=2", "override 'shape.size=2': shape.size is now shape.scale"),
    ],
)
def test_a_moved_key_is_refused_in_one_line_naming_its_new_place(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(WithShape, None, [override])
    assert str(err.value) == message
