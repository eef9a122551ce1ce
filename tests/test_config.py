"""Configuration in Bridge's conventions: a ``mimo_accel:`` YAML section read by real OmegaConf as a
structured config of AccelConfig, ``key=value`` overrides, the environment round trip, and the checks
``enable()`` makes (switches are booleans, counts integers, named files exist)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

import mimo_accel
from mimo_accel.config import CONFIG_ENV, AccelConfig, ConfigError, check_environment, resolve_window


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
    ("mimo_accel: {reorder_window: 2.5}\n", [], ["reorder_window must be a positive integer or step, got 2.5"]),
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
    AccelConfig(cost_index=str(tmp_path / "costs-{split}.npz"), cost_model=str(tmp_path / "cost.json"),
                profile=str(tmp_path / "runs" / "new")).check_paths()
    AccelConfig(cost_index=str(tmp_path / "costs-train.npz")).check_paths()
    assert not (tmp_path / "runs").exists()  # checked, not made
    # a path object is kept as its string
    assert AccelConfig(profile=tmp_path / "p").profile == str(tmp_path / "p")


@pytest.mark.parametrize("where, words", [
    ("file", "{d}/file is a file, not a directory"),
    ("file/runs", "{d}/file is a file, so the directory {d}/file/runs cannot be made"),
    ("file/a/b", "{d}/file is a file, so the directory {d}/file/a/b cannot be made"),
])
def test_a_profile_path_that_cannot_be_a_directory_is_one_line_naming_the_setting(clean_engine, tmp_path, where,
                                                                                   words):
    (tmp_path / "file").write_text("not a directory\n")
    for make in (lambda: AccelConfig(profile=str(tmp_path / where)).check_paths(),
                 lambda: mimo_accel.enable(profile=str(tmp_path / where))):
        with pytest.raises(ConfigError) as err:
            make()
        message = str(err.value)
        assert message.startswith(f"profile='{tmp_path / where}': ") and "\n" not in message
        assert words.format(d=tmp_path) in message and "profile=DIR, MIMO_ACCEL_PROFILE=DIR" in message
    assert mimo_accel.status()["patched"] == []


def test_a_cache_directory_that_cannot_be_made_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="MIMO_ACCEL_CACHE_DIR='.*file/cache'.* is a file, so the directory"):
        AccelConfig().check_paths({"MIMO_ACCEL_CACHE_DIR": str(tmp_path / "file" / "cache")})
    AccelConfig().check_paths({"MIMO_ACCEL_CACHE_DIR": str(tmp_path / "cache")})


def test_paths_become_absolute_where_they_are_set(clean_engine, tmp_path, monkeypatch):
    (tmp_path / "costs-train.npz").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    cfg = AccelConfig(packing=True, cost_index="costs-{split}.npz", profile="runs/after").absolute()
    assert cfg.cost_index == str(tmp_path / "costs-{split}.npz") and cfg.profile == str(tmp_path / "runs/after")
    assert AccelConfig(profile="/abs/dir").absolute().profile == "/abs/dir"
    from mimo_accel.config import DEFAULT_PROFILE_DIR

    assert AccelConfig.from_env({"MIMO_ACCEL": "profile"}).absolute().profile == str(tmp_path / DEFAULT_PROFILE_DIR)


@pytest.mark.megatron
def test_enable_makes_the_paths_absolute_against_this_process(clean_engine, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = mimo_accel.enable(sharded_reads=True, profile="runs/after")
    assert cfg.profile == str(tmp_path / "runs" / "after") == mimo_accel.status()["config"].profile


@pytest.mark.megatron
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


def test_one_name_per_setting_and_the_earlier_cost_variable_refused():
    # every option that is not a switch has the variable MIMO_ACCEL_<FIELD>
    from mimo_accel.config import ENV_OPTIONS, SWITCHES

    fields = {f.name for f in dataclasses.fields(AccelConfig)}
    assert set(ENV_OPTIONS) | set(SWITCHES) == fields
    assert all(var == "MIMO_ACCEL_" + name.upper() for name, var in ENV_OPTIONS.items())
    assert AccelConfig.from_env({"MIMO_ACCEL_COST_MODEL": "c.json"}).cost_model == "c.json"
    with pytest.raises(ConfigError, match="MIMO_ACCEL_COST is not a mimo_accel variable"):
        check_environment({"MIMO_ACCEL_COST": "b.json"})
    with pytest.raises(ConfigError, match="MIMO_ACCEL_PAD_MULTIPLE: pad_multiple must be a positive integer"):
        AccelConfig.from_env({"MIMO_ACCEL_PAD_MULTIPLE": "0"})


# -- calibrate_online: one setting, every way in -------------------------------------------------


def test_calibrate_online_is_on_by_default_and_set_every_way(tmp_path):
    assert AccelConfig().calibrate_online is True
    assert AccelConfig.from_env({"MIMO_ACCEL": "reorder", "MIMO_ACCEL_CALIBRATE_ONLINE": "0"}).calibrate_online is False
    assert AccelConfig.from_env({"MIMO_ACCEL_CALIBRATE_ONLINE": "1"}).calibrate_online is True
    path = _yaml(tmp_path, "mimo_accel: {reorder: true, calibrate_online: false}\n")
    assert mimo_accel.load_config(path).calibrate_online is False
    assert mimo_accel.load_config(path, ["calibrate_online=true"]).calibrate_online is True
    pinned = AccelConfig(reorder=True, calibrate_online=False)
    assert pinned.to_env()["MIMO_ACCEL_CALIBRATE_ONLINE"] == "0"
    assert AccelConfig.from_env(pinned.to_env()) == pinned
    # in what the plan-input check digests (runtime/loaders.py: asdict minus profile)
    assert dataclasses.asdict(pinned)["calibrate_online"] is False


@pytest.mark.parametrize("make, words", [
    (lambda: AccelConfig(calibrate_online="no"), "calibrate_online must be True or False, got 'no'"),
    (lambda: AccelConfig.from_env({"MIMO_ACCEL_CALIBRATE_ONLINE": "sometimes"}),
     "MIMO_ACCEL_CALIBRATE_ONLINE='sometimes': expected 1 or 0"),
    (lambda: mimo_accel.load_config(overrides=["calibrate_online=2"]),
     "mimo_accel.calibrate_online must be true or false"),
])
def test_calibrate_online_is_validated_like_the_other_switches(make, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make()


# -- Bridge's override grammar (process_config_with_overrides: Hydra's) --------------------------


def test_bridge_override_grammar_sets_and_resets_in_order(tmp_path):
    path = _yaml(tmp_path, "mimo_accel: {reorder: true, reorder_window: 4, pad_multiple: 2}\n")
    cfg = mimo_accel.load_config(path, ["+packing=true", "++mimo_accel.pad_multiple=8", "~reorder_window",
                                        "+mimo_accel.profile=runs/x", "~profile=runs/x", "~pad_multiple=8",
                                        "strict_gradients=true"])
    assert cfg == AccelConfig(reorder=True, packing=True, strict_gradients=True)
    # ~key=value only where the option has that value, as Hydra's delete
    with pytest.raises(ConfigError, match=r"override '~reorder_window=2': mimo_accel.reorder_window is 4, not 2"):
        mimo_accel.load_config(path, ["~reorder_window=2"])
    # a later override wins; a reset puts the default back over the base too
    base = AccelConfig(packing=True)
    assert mimo_accel.load_config(overrides=["packing=true", "~packing"], base=base) == AccelConfig()


@pytest.mark.parametrize("yaml_text, overrides, words", [
    ("mimo_accel: {}\n", ["reorder_windw=4"],
     "'reorder_windw' is not a mimo_accel option; did you mean 'reorder_window'?"),
    ("mimo_accel: {}\n", ["+mimo_acel.packing=true"], "did you mean 'mimo_accel.packing'?"),
    ("mimo_accel: {}\n", ["~calibrate_onlin"], "did you mean 'calibrate_online'?"),
    ("mimo_accel: {reoder: true}\n", [], "'reoder' is not a mimo_accel option; did you mean 'reorder'?"),
    ("mimo_accel: {}\n", ["+packing"], "override '+packing': write key=value (or Bridge's +key=value"),
    ("mimo_accel: {}\n", ["++pad_multiple=0"], "pad_multiple must be a positive integer, got 0"),
])
def test_an_unknown_or_malformed_override_names_the_closest_key(tmp_path, yaml_text, overrides, words):
    with pytest.raises(ConfigError) as err:
        mimo_accel.load_config(_yaml(tmp_path, yaml_text), overrides)
    assert words in str(err.value) and "\n" not in str(err.value)


# -- the variables: every name known, a mistyped one said -----------------------------------------


def test_every_mimo_accel_variable_the_package_reads_is_known():
    """A variable named anywhere in the package (a string constant) is one config.KNOWN_ENV lists,
    so enable() / run / env never call a real one unknown (the bootstrap's probe variable is set by
    `mimo-accel run` for one question, never for a job: it is meant to be refused there)."""
    import re
    from pathlib import Path

    from mimo_accel.config import KNOWN_ENV

    root = Path(mimo_accel.__file__).parent
    named = set()
    for path in [*root.rglob("*.py"), *(root.parent / "mimo_accel_dev").rglob("*.py")]:  # and the kit's
        named |= set(re.findall(r"MIMO_ACCEL_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    assert named - set(KNOWN_ENV) == {"MIMO_ACCEL_BOOTSTRAP_PROBE"}
    usage = (root.parent / "docs" / "usage.md").read_text(encoding="utf-8")
    assert [var for var in KNOWN_ENV if f"`{var}`" not in usage] == []  # every one documented


@pytest.mark.parametrize("env, words", [
    ({"MIMO_ACCEL_REODER_WINDOW": "2"}, "MIMO_ACCEL_REODER_WINDOW is not a mimo_accel variable (did you mean "
                                        "MIMO_ACCEL_REORDER_WINDOW?)"),
    ({"MIMO_ACCEL_COSTINDEX": "c.npz"}, "did you mean MIMO_ACCEL_COST_INDEX?"),
    ({"MIMO_ACCEL_PROFIL": "runs/x"}, "did you mean MIMO_ACCEL_PROFILE?"),
    ({"mimo_accel": "all"}, "mimo_accel is not a mimo_accel variable (did you mean MIMO_ACCEL?)"),
    ({"MIMO_ACCEL_XYZZY": "1"}, "the variables are MIMO_ACCEL, "),
])
def test_an_unknown_variable_is_named_with_the_closest_known_one(env, words):
    from mimo_accel.config import check_environment, unknown_variables

    (line,) = unknown_variables(env)
    assert words in line
    with pytest.raises(ConfigError, match="rename or unset it"):
        check_environment(env)
    assert unknown_variables({"MIMO_ACCELERATOR": "x", "PATH": "/bin"}) == []  # not a MIMO_ACCEL* name


@pytest.mark.parametrize("env, words", [
    ({"MIMO_ACCEL_ALLOW_UNTESTED": "maybe"}, "MIMO_ACCEL_ALLOW_UNTESTED='maybe': use 1"),
    ({"MIMO_ACCEL_TRACEBACK": "yes"}, "MIMO_ACCEL_TRACEBACK='yes': use 1"),
    ({"MIMO_ACCEL_STRICT_GRADIENTS": "sure"}, "expected 1 or 0"),
])
def test_check_environment_checks_every_value(env, words):
    from mimo_accel.config import check_environment

    with pytest.raises(ConfigError, match=words):
        check_environment(env)
    assert check_environment({"MIMO_ACCEL_ALLOW_UNTESTED": "1", "MIMO_ACCEL_CACHE_DIR": "/c"}) == AccelConfig()


@pytest.mark.megatron
def test_enable_warns_an_unknown_variable_once_with_the_closest_name(clean_engine, monkeypatch, caplog):
    from mimo_accel.patching import engine

    from mimo_accel.notices import Notices

    monkeypatch.setattr(engine, "_said", Notices(engine.logger))
    monkeypatch.setenv("MIMO_ACCEL_REODER_WINDOW", "2")
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(sharded_reads=True)
        mimo_accel.enable(sharded_reads=True, packing=True)
    said = [r.getMessage() for r in caplog.records if "REODER" in r.getMessage()]
    assert said == ["mimo_accel: MIMO_ACCEL_REODER_WINDOW is not a mimo_accel variable (did you mean "
                    "MIMO_ACCEL_REORDER_WINDOW?); it is ignored"]


# -- enable(): what a new config turns off, and options that cannot act ---------------------------


@pytest.mark.megatron
def test_a_second_enable_that_turns_features_off_says_which(clean_engine, caplog):
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(reorder=True)
        mimo_accel.enable(packing=True)
    (line,) = [r.getMessage() for r in caplog.records if "turns off" in r.getMessage()]
    assert line.startswith("mimo_accel: this enable() turns off sharded_reads, reorder, which an earlier enable() "
                           "turned on")
    assert "pass sharded_reads=True, reorder=True again" in line and "mimo_accel.disable() first" in line
    assert mimo_accel.status()["active"] == ["packing"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(packing=True, reorder=True)  # adds only: nothing to say
        mimo_accel.disable()
        mimo_accel.enable(sharded_reads=True)  # after disable(): a fresh start
    assert not [r for r in caplog.records if "turns off" in r.getMessage()]


@pytest.mark.parametrize("kwargs, words", [
    (dict(reorder_window=4),
     ["reorder_window=4 has no effect without reorder: turn reorder on, or drop reorder_window"]),
    (dict(packing=True, reorder_mode="exchange", calibrate_online=False),
     ["reorder_mode='exchange' has no effect without reorder", "calibrate_online=False has no effect without reorder"]),
    (dict(sharded_reads=True, pad_multiple=2), ["pad_multiple=2 has no effect without packing"]),
    (dict(reorder=True, reorder_mode="exchange", cost_index="{d}/c.npz"),
     ["cost_index='{d}/c.npz' has no effect with reorder_mode='exchange'"]),
])
@pytest.mark.megatron
def test_an_option_without_its_feature_is_warned(clean_engine, tmp_path, caplog, kwargs, words):
    (tmp_path / "c.npz").write_bytes(b"")
    kwargs = {k: v.format(d=tmp_path) if isinstance(v, str) else v for k, v in kwargs.items()}
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(**kwargs)
    said = [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
    assert len(said) == len(words), said
    for line, w in zip(said, words):
        assert line.startswith(f"mimo_accel: {w.format(d=tmp_path)}"), line


@pytest.mark.megatron
def test_options_with_their_feature_on_are_not_warned(clean_engine, caplog):
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(reorder=True, reorder_window=2, strict_gradients=True, calibrate_online=False,
                          packing=True, pad_multiple=2)
    assert not [r for r in caplog.records if "has no effect" in r.getMessage()]


# Each way a user sets reorder_window, as a function of the value written: AccelConfig's own field,
# enable()'s keyword, the environment, the YAML section and a key=value override.
WINDOW_SPELLINGS = {
    "AccelConfig": lambda value, tmp: AccelConfig(reorder=True, reorder_window=value),
    "environment": lambda value, tmp: AccelConfig.from_env({"MIMO_ACCEL": "reorder",
                                                            "MIMO_ACCEL_REORDER_WINDOW": str(value)}),
    "YAML": lambda value, tmp: mimo_accel.load_config(
        _yaml(tmp, f"mimo_accel: {{reorder: true, reorder_window: {value}}}\n")),
    "override": lambda value, tmp: mimo_accel.load_config(None, ["reorder=true", f"reorder_window={value}"]),
}


@pytest.mark.parametrize("spelling", sorted(WINDOW_SPELLINGS))
@pytest.mark.parametrize("written, value", [(4, 4), ("step", "step"), ("Step", "step")])
def test_every_spelling_of_a_window_gives_the_same_value(spelling, written, value, tmp_path):
    cfg = WINDOW_SPELLINGS[spelling](written, tmp_path)
    assert cfg == AccelConfig(reorder=True, reorder_window=value)
    assert AccelConfig.from_env(cfg.to_env()) == cfg


@pytest.mark.parametrize("spelling", sorted(WINDOW_SPELLINGS))
@pytest.mark.parametrize("written", [0, "steps"])
def test_every_spelling_of_a_bad_window_says_the_same_line(spelling, written, tmp_path):
    """One parser (config.parse_window): each path prefixes where the value came from, if anything."""
    with pytest.raises(ConfigError) as caught:
        WINDOW_SPELLINGS[spelling](written, tmp_path)
    line = (f"reorder_window must be a positive integer or step, got {written!r}; "
            "e.g. reorder_window=4 or reorder_window=step")
    where = {"AccelConfig": "", "environment": "MIMO_ACCEL_REORDER_WINDOW: ", "YAML": f"{tmp_path / 'run.yaml'}: ",
             "override": f"override 'reorder_window={written}': "}[spelling]
    assert str(caught.value) == where + line


def test_a_window_is_resolved_against_the_step_and_must_tile_it():
    assert resolve_window("step", 16) == 16 and resolve_window(4, 16) == 4 and resolve_window(1, None) == 1
    with pytest.raises(ConfigError, match=r"reorder_window=3 does not divide.*Valid values: \[1, 2, 4\]"):
        resolve_window(3, 4)
    for window in (2, "step"):
        with pytest.raises(ConfigError, match=f"reorder_window={window} needs the number of micro-batches per "
                                              "training step.*or set reorder_window=1"):
            resolve_window(window, None)
