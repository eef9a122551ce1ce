"""The modules of a layout: every module timed under its own name and priced by its own cost."""

from __future__ import annotations

import pytest

from mimo_accel.modules import LANGUAGE, Modules, module, timers_of


def test_every_module_is_timed_and_priced_by_its_own_name():
    mods = Modules.from_dp_sizes({"images": 2, "audios": 4, LANGUAGE: 1})
    assert [(m.name, m.cost, m.timer) for m in mods] == [
        ("images", "images", "images"), ("audios", "audios", "audios"), ("language", "language", "language")]
    assert timers_of(mods) == ("images", "audios", "language")
    assert [m.name for m in mods.encoders] == ["images", "audios"] and mods.language.is_language
    assert mods.grid == 4 and mods.encoder_groups() == 4 and mods.dp_sizes == {"images": 2, "audios": 4, "language": 1}
    assert mods["audios"].dp == 4
    with pytest.raises(KeyError, match="modules: images, audios, language"):
        mods["vision"]


def test_bad_modules_are_refused():
    with pytest.raises(ValueError, match="positive integer"):
        module("vision", 0)
    with pytest.raises(ValueError, match="non-empty name"):
        module("", 1)
    with pytest.raises(ValueError, match="at least one module"):
        Modules.from_dp_sizes({})
