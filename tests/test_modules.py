"""The modules of a layout: the one layout model (names, kinds, parallel sizes, rank placement)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_accel.modules import KINDS, LANGUAGE, Modules, module, replica_seconds
from tests._hypothesis import examples


def test_every_module_has_its_name_its_kind_and_its_sizes():
    mods = Modules.from_dp_sizes({"images": 2, "audios": 4, LANGUAGE: 1})
    assert [(m.name, m.kind, m.dp, m.tp, m.pp) for m in mods] == [
        ("images", "image", 2, 1, 1), ("audios", "audio", 4, 1, 1), ("language", "text", 1, 1, 1)]
    assert [m.name for m in mods.encoders] == ["images", "audios"] and mods.language.is_language
    assert mods.grid == 4 and mods.dp_sizes == {"images": 2, "audios": 4, "language": 1}
    assert mods["audios"].dp == 4 and "audios" in mods and "vision" not in mods and len(mods) == 3
    with pytest.raises(KeyError, match="modules: images, audios, language"):
        mods["vision"]


def test_a_kind_is_given_or_implied_by_the_name():
    assert [module(n, 1).kind for n in ("vision", "images", "video", "videos", "audio", "audios", LANGUAGE, "ocr")] == [
        "image", "image", "video", "video", "audio", "audio", "text", "image"]
    mods = Modules.from_dp_sizes({"clips": 2, LANGUAGE: 2}, kinds={"clips": "video"})
    assert mods["clips"].kind == "video" and set(KINDS) == {"image", "video", "audio", "text"}


def test_rank_placement_encoders_in_their_order_then_the_language_module():
    layout = Modules.of(module("vision", 2, tp=2), module(LANGUAGE, 4))
    assert layout.rank_offsets() == {"vision": 0, LANGUAGE: 4} and layout.world_size == 8
    assert str(layout) == "vision(tp2,pp1,dp2)->language(tp1,pp1,dp4)"
    three = Modules.from_dp_sizes({LANGUAGE: 4, "vision": 2, "audio": 1})  # the config's order kept
    assert three.rank_offsets() == {"vision": 0, "audio": 2, LANGUAGE: 3} and three.world_size == 7
    assert str(three) == "vision(tp1,pp1,dp2)+audio(tp1,pp1,dp1)->language(tp1,pp1,dp4)"
    assert [three.module_of_rank(r) for r in range(8)] == ["vision"] * 2 + ["audio"] + [LANGUAGE] * 4 + [None]
    assert pickle.loads(pickle.dumps(three)) == three and hash(three) == hash(Modules(three.all))
    wider = three.replace("vision", dp=4, tp=2)
    assert wider["vision"] == module("vision", 4, tp=2) and wider["audio"] is three["audio"]


def test_bad_modules_are_refused():
    with pytest.raises(ValueError, match="positive integer"):
        module("vision", 0)
    with pytest.raises(ValueError, match="tensor-parallel size must be a positive integer"):
        module("vision", 1, tp=0)
    with pytest.raises(ValueError, match="non-empty name"):
        module("", 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        module("vision", 1, kind="lidar")
    with pytest.raises(ValueError, match="one module of kind 'text'"):
        module("captions", 1, kind="text")
    with pytest.raises(ValueError, match="one module of kind 'text'"):
        module(LANGUAGE, 1, kind="image")
    with pytest.raises(ValueError, match="at least one module"):
        Modules.from_dp_sizes({})
    with pytest.raises(ValueError, match="vision appears twice"):
        Modules.of(module("vision", 1), module("vision", 2))


@given(stages=st.integers(1, 4), tp=st.integers(1, 4), seed=st.integers(0, 2**16))
@settings(max_examples=examples(60), deadline=None)
def test_a_replicas_seconds_are_its_stages_summed_each_its_slowest_rank(stages, tp, seed):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.0, 2.0, size=(stages, tp))  # [stage, tp rank]: ranks numbered tp fastest, pp slowest
    first = int(rng.integers(0, 100))
    times = {first + 7 * (p * tp + k): float(t[p, k]) for p in range(stages) for k in range(tp)}
    assert replica_seconds(times, stages) == pytest.approx(t.max(axis=1).sum())
    assert replica_seconds(times, 1) == pytest.approx(t.max())  # one stage: its slowest rank
