"""Configuration in Bridge's conventions: a ``mimo_accel:`` YAML section read by real OmegaConf as a
structured config of AccelConfig, ``key=value`` overrides, the environment round trip, and the checks
``enable()`` makes (switches are booleans, counts integers, named files exist)."""

from __future__ import annotations

import dataclasses

import pytest

import mimo_accel
from mimo_accel.config import CONFIG_ENV, AccelConfig, ConfigError


@pytest.fixture
def clean_engine():
    mimo_accel.disable()
    yield
    mimo_accel.disable()


def _yaml(tmp_path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_section_of_a_bridge_style_file_with_overrides_on_top(tmp_path, monkeypatch):
    monkeypatch.setenv("I20_RUN_DIR", str(tmp_path / "runs"))
    path = _yaml(tmp_path, """
logger:
  tensorboard_dir: /data/tb
train:
  micro_batch_size: 4
mimo_accel:
  reorder: true
  packing: yes
  cost_index: costs-{split}.npz
  profile: ${oc.env:I20_RUN_DIR}/after
  pad_multiple: 2
""")
    cfg = mimo_accel.load_config(path, overrides=["reorder_window=4", "mimo_accel.pad_multiple=8", "packing=false"])
    assert cfg == AccelConfig(sharded_reads=True, reorder=True, reorder_window=4, cost_index="costs-{split}.npz",
                              packing=False, pad_multiple=8, profile=str(tmp_path / "runs" / "after"))
    # an interpolation into another section of the same file resolves
    path = _yaml(tmp_path, "logger: {dir: /data/tb}\nmimo_accel: {profile: '${logger.dir}/prof'}\n", "b.yaml")
    assert mimo_accel.load_config(path).profile == "/data/tb/prof"
    # no file: the overrides over the defaults (or over a base config)
    assert mimo_accel.load_config(overrides=["packing=true"]) == AccelConfig(packing=True)
    assert mimo_accel.load_config(overrides=["profile=null"], base=AccelConfig(profile="x")) == AccelConfig()
    # an empty section is the defaults
    assert mimo_accel.load_config(_yaml(tmp_path, "mimo_accel:\n", "c.yaml")) == AccelConfig()


@pytest.mark.parametrize("yaml_text, overrides, expect", [
    ("mimo_accel: {packing: true}\n", ["packng=true"], ["'packng' is not a mimo_accel option", "packing"]),
    ("mimo_accel: {packing: true}\n", ["packing=2"], ["mimo_accel.packing must be true or false", "packing=true"]),
    ("mimo_accel: {packing: 1}\n", [], ["run.yaml", "mimo_accel.packing must be true or false"]),
    ("mimo_accel: {packing: 'true'}\n", [], ["mimo_accel.packing must be true or false, got 'true'"]),
    ("mimo_accel: {}\n", ["pad_multiple=abc"], ["mimo_accel.pad_multiple must be a positive integer", "got 'abc'"]),
    ("mimo_accel: {}\n", ["pad_multiple=0"], ["pad_multiple must be a positive integer, got 0"]),
    ("mimo_accel: {reorder_window: 2.5}\n", [], ["reorder_window must be a positive integer, got 2.5"]),
    ("mimo_accel: {reorder_mode: fast}\n", [], ["reorder_mode='fast' is not one of", "reorder_mode=exchange"]),
    ("mimo_accel: {cost_model: 3}\n", [], ["mimo_accel.cost_model must be a path"]),
    ("mimo_accel: {}\n", ["junk"], ["override 'junk': write key=value"]),
    ("train: {lr: 1}\n", [], ["has no mimo_accel: section", "mimo_accel: {packing: true}"]),
    ("mimo_accel: 3\n", [], ["must be a mapping of options"]),
    ("mimo_accel: {packing: [\n", [], ["is not valid YAML", "line"]),
    ("mimo_accel: {profile: '${nope.dir}'}\n", [], ["an interpolation does not resolve", "nope.dir"]),
])
def test_bad_values_name_the_option_and_the_fix(tmp_path, yaml_text, overrides, expect):
    path = _yaml(tmp_path, yaml_text)
    with pytest.raises(ConfigError) as err:
        mimo_accel.load_config(path, overrides)
    assert "\n" not in str(err.value)
    for words in expect:
        assert words in str(err.value)


def test_missing_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        mimo_accel.load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("kwargs, words", [
    (dict(packing="yes"), "packing must be True or False, got 'yes'"),
    (dict(sharded_reads=1), "sharded_reads must be True or False, got 1"),
    (dict(pad_multiple=1.5), "pad_multiple must be a positive integer"),
    (dict(reorder_window=True), "reorder_window must be a positive integer"),
    (dict(profile=""), "profile must be None or a directory path"),
    (dict(cost_model="/nonexistent/cost.json"), "cost_model='/nonexistent/cost.json': no such file"),
    (dict(cost_index="/nonexistent/costs-{split}.npz"),
     "cost_index='/nonexistent/costs-train.npz' (the train split of '/nonexistent/costs-{split}.npz'): no such file"),
])
def test_enable_checks_the_options_before_patching(clean_engine, kwargs, words):
    with pytest.raises(ConfigError) as err:
        mimo_accel.enable(**kwargs)
    assert words in str(err.value)
    assert mimo_accel.status()["patched"] == []


def test_enable_rejects_what_is_not_an_accelconfig(clean_engine):
    with pytest.raises(ConfigError, match="takes an AccelConfig"):
        mimo_accel.enable(config={"packing": True})


def test_files_that_exist_pass_the_check(tmp_path):
    (tmp_path / "costs-train.npz").write_bytes(b"")
    (tmp_path / "cost.json").write_text("{}")
    AccelConfig(cost_index=str(tmp_path / "costs-{split}.npz"), cost_model=str(tmp_path / "cost.json")).check_files()
    AccelConfig(cost_index=str(tmp_path / "costs-train.npz")).check_files()
    # a path object is kept as its string
    assert AccelConfig(profile=tmp_path / "p").profile == str(tmp_path / "p")


def test_enable_from_a_yaml_file(clean_engine, tmp_path):
    path = _yaml(tmp_path, "mimo_accel:\n  sharded_reads: true\n  packing: true\n")
    cfg = mimo_accel.enable(config=mimo_accel.load_config(path))
    assert mimo_accel.status()["active"] == ["sharded_reads", "packing"] and cfg.packing
    assert mimo_accel.status()["patched"]


@pytest.mark.parametrize("cfg", [
    AccelConfig(),
    AccelConfig(sharded_reads=True),
    AccelConfig(reorder=True, packing=True, reorder_mode="exchange", reorder_window=3),
    AccelConfig(packing=True, pad_multiple=4, profile="runs/x", cost_model="c.json", cost_index="i-{split}.npz"),
    AccelConfig(profile="runs/only-profile"),
])
def test_environment_round_trip(cfg):
    env = cfg.to_env()
    assert set(env) <= set(CONFIG_ENV)
    assert AccelConfig.from_env(env) == cfg


def test_one_name_per_setting_and_the_earlier_cost_variable():
    # every option that is not a switch has the variable MIMO_ACCEL_<FIELD>
    from mimo_accel.config import ENV_OPTIONS, SWITCHES

    fields = {f.name for f in dataclasses.fields(AccelConfig)}
    assert set(ENV_OPTIONS) | set(SWITCHES) == fields
    assert all(var == "MIMO_ACCEL_" + name.upper() for name, var in ENV_OPTIONS.items())
    assert AccelConfig.from_env({"MIMO_ACCEL_COST": "old.json"}).cost_model == "old.json"
    assert AccelConfig.from_env({"MIMO_ACCEL_COST_MODEL": "c.json", "MIMO_ACCEL_COST": "c.json"}).cost_model == "c.json"
    with pytest.raises(ConfigError, match="disagree"):
        AccelConfig.from_env({"MIMO_ACCEL_COST_MODEL": "a.json", "MIMO_ACCEL_COST": "b.json"})
    with pytest.raises(ConfigError, match="MIMO_ACCEL_PAD_MULTIPLE: pad_multiple must be a positive integer"):
        AccelConfig.from_env({"MIMO_ACCEL_PAD_MULTIPLE": "0"})
