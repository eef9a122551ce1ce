"""The closed version guard: tested (megatron-bridge, megatron-core) pairs only, unless
MIMO_ACCEL_ALLOW_UNTESTED=1; and the main shape's own packer (simulated on the installed 0.6.2)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import pytest
import torch

import mimo_accel
from mimo_accel.tools import doctor
from mimo_accel.config import ConfigError
from mimo_accel.notices import Notices
from mimo_accel.patching import engine
from mimo_accel.patching import targets as T
from mimo_accel.patching.engine import PatchError

ENV = T.ALLOW_UNTESTED_ENV
MAIN = ("0.7.0+067f987", "0.20.0+2a75ac1")


@pytest.fixture
def guard(monkeypatch):
    """Fake installed versions through the engine's one reader; a clean engine around the test."""
    mimo_accel.disable()
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(engine, "_said", Notices(engine.logger))

    def fake(bridge, core):
        monkeypatch.setattr(engine, "installed_versions", lambda: (bridge, core))

    yield fake
    mimo_accel.disable()


def _sites():
    import megatron.bridge.data.megatron_mimo.dp_utils as dp_utils
    import megatron.bridge.data.megatron_mimo.loaders as loaders
    import megatron.bridge.training.megatron_mimo_step as step

    return dp_utils, loaders, step


def _bindings():
    dp_utils, loaders, step = _sites()
    return (dp_utils.slice_batch_for_megatron_mimo, step.slice_batch_for_megatron_mimo,
            loaders.get_megatron_mimo_sampling_info, loaders.build_pretraining_data_loader,
            step._get_module_dp_info)


# -- matching (pure) ----------------------------------------------------------------------------


@pytest.mark.parametrize("bridge, core, status, shape", [
    ("0.6.2", "0.19.2", "tested", "0.6"),
    ("0.6.0", "0.19.0", "tested", "0.6"),
    ("0.7.0+067f987", "0.20.0+2a75ac1", "tested", "main"),
    ("0.7.0+067f987df", "0.20.0+2a75ac12c5", "tested", "main"),  # longer abbreviations
    ("0.6.3", "0.19.2", "patch", "0.6"),  # a newer patch release: accepted where its targets fit
    ("0.6.2", "0.19.3", "patch", "0.6"),
    ("0.6.4", "0.19.7", "patch", "0.6"),
    ("0.6.3rc1", "0.19.2", "untested", "0.6"),  # a pre-release is not a release
    ("0.6.3+abcdef1", "0.19.2", "untested", "0.6"),  # nor is a source build
    ("0.6.3", "0.20.0", "untested", "0.6"),  # a newer minor is not a patch release
    ("0.6.2", "0.20.0", "untested", "0.6"),
    ("0.6.2", "0.19.2+abcdef1", "build", "0.6"),  # a source build of a listed release: its targets decide
    ("0.6.0+1234abc", "0.19.2", "build", "0.6"),  # a build reporting 0.6.0 whose source has 0.6's shape
    ("0.6.0+fdf31e415", "0.19.0+adfb8ec792", "tested", "sparse-4986"),  # PR #4986's head and its core
    ("0.6.0+fdf31e415", "0.19.2", "build", "0.6"),  # #4986 with a released core: the 0.6 shape, checked
    ("0.7.0", "0.20.0", "untested", "main"),  # a release 0.7.0 is not commit 067f987
    ("0.7.0+1234567", "0.20.0+2a75ac1", "untested", "main"),
    ("0.7.0+958575fc3", "0.20.0+24bad8e677", "tested", "scalable-5525"),  # PR #5525's head and its core
    ("0.7.0+958575fc3", "0.20.0+2a75ac1", "untested", "main"),  # #5525 with main's core: not a tested pair
    ("0.7.0+067f987", "0.20.0+24bad8e", "untested", "main"),
    ("0.7.0+067f987df", "0.20.0+d98e8a64dd", "tested", "main-lm"),  # Megatron-LM main, newer than the pin
    ("0.7.0+067f987", "0.20.0+d98e8a7", "untested", "main"),  # nor another commit beside it
    ("0.9.1", "0.22.0", "untested", "main"),
    ("0.5.1", "0.19.2", "untested", "0.6"),
])
def test_match_is_closed_over_both_packages(bridge, core, status, shape):
    m = T.match(bridge, core, sources=())  # the installed 0.6.2's source: neither upstream feature
    assert (m.status, m.shape.name) == (status, shape)
    assert bool(m.problems) == (status in ("untested", "patch", "build"))


@pytest.mark.parametrize("bridge, core, sources, status, shape", [
    # Bridge main at another commit: the step packs itself (sequence_pack.py), as main's does
    ("0.7.0+1234567", "0.20.0+2a75ac1", {"native_packing"}, "build", "main"),
    ("0.7.0+1234567", "0.20.0+abcdef1", {"native_packing"}, "build", "main"),
    # with upstream's scalable reads too: #5525's shape, whichever core
    ("0.7.0+958575fc3", "0.20.0+2a75ac1", {"native_packing", "scalable_reads"}, "build", "scalable-5525"),
    # a build whose source has no shape's features: untested
    ("0.7.0+1234567", "0.20.0+2a75ac1", set(), "untested", "main"),
    ("0.7.0+1234567", "0.20.0+2a75ac1", {"scalable_reads"}, "untested", "main"),
    # main between June and August reported 0.6.0 and packed in the step: not the 0.6 shape
    ("0.6.0+1234abc", "0.19.2", {"native_packing"}, "untested", "0.6"),
    # PR #4608's tree (0.6.0 plus its commit) packs micro-batches its own way: no shape has that
    ("0.6.0+984a8a5", "0.19.2", {"intra_microbatch_pack"}, "untested", "0.6"),
    # a release is no source build, whatever its files
    ("0.7.0", "0.20.0", {"native_packing"}, "untested", "main"),
    ("0.6.3+abcdef1", "0.19.2", set(), "untested", "0.6"),  # no listed version's public part
])
def test_a_source_build_takes_the_shape_its_source_has(bridge, core, sources, status, shape):
    m = T.match(bridge, core, sources=sources)
    assert (m.status, m.shape.name) == (status, shape)
    if status == "build":
        assert all("is a source build" in p for p in m.problems) and m.problems


def test_the_installed_source_is_read_without_importing_it():
    import importlib.util

    # the files the installed tree has are the upstream features its shape declares (0.6.2: none;
    # main: its own packer; #5525: scalable reads too)
    shape = T.match(*engine.installed_versions()).shape
    assert shape is not None, "the suite runs on a tested pair"
    assert T.installed_sources() == {name for name in T.SOURCE_MARKERS if getattr(shape, name, False)}
    root = importlib.util.find_spec("megatron").submodule_search_locations[0]
    import os

    for parts in T.SOURCE_MARKERS.values():  # the files sit where every shape keeps the MIMO data modules
        assert os.path.isdir(os.path.join(root, *parts[:-1]))


def test_match_without_a_package():
    m = T.match("0.6.2", None)
    assert m.status == "missing" and m.shape is None and "megatron-core is not installed" in m.problems


# -- enable() ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bridge, core, named", [("0.6.3rc1", "0.19.2", "megatron-bridge 0.6.3rc1 is not one of"),
                                                 ("0.6.2", "0.20.0", "megatron-core 0.20.0 is not one of")])
def test_untested_bridge_or_core_is_refused_before_anything_is_patched(guard, bridge, core, named):
    before = _bindings()
    mimo_accel.enable(sharded_reads=True)  # a tested pair first: its patches must go too
    assert mimo_accel.status()["patched"]
    guard(bridge, core)
    with pytest.raises(PatchError) as err:
        mimo_accel.enable(sharded_reads=True, packing=True)
    msg = str(err.value)
    assert f"megatron-bridge {bridge} with megatron-core {core}" in msg and named in msg
    assert "0.6.2" in msg and "0.19.2" in msg and "067f987" in msg  # the tested versions
    assert f"{ENV}=1" in msg and "Nothing was patched" in msg
    assert mimo_accel.status()["patched"] == [] and mimo_accel.status()["waiting_for_import"] == []
    assert _bindings() == before


@pytest.mark.megatron
def test_allow_untested_uses_the_nearest_shape_and_warns_once(guard, monkeypatch, caplog):
    guard("0.6.3rc1", "0.19.3")
    monkeypatch.setenv(ENV, "1")
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(sharded_reads=True)
        mimo_accel.disable()
        mimo_accel.enable(sharded_reads=True, packing=True)
    st = mimo_accel.status()
    assert st["shape"] == "0.6" and st["support"] == "untested" and st["patched"]
    assert (st["megatron_bridge"], st["megatron_core"]) == ("0.6.3rc1", "0.19.3")
    warnings = [r.getMessage() for r in caplog.records if "untested" in r.getMessage()]
    assert len(warnings) == 1 and "0.6.3rc1" in warnings[0] and "0.19.3" in warnings[0] and "'0.6'" in warnings[0]


@pytest.mark.megatron
@pytest.mark.parametrize("bridge, support, said", [("0.6.3", "patch", "newer patch release"),
                                                   ("0.6.2+1a2b3c4", "build", "is a source build")])
def test_a_newer_patch_release_or_a_source_build_is_accepted_with_one_notice(guard, caplog, monkeypatch, bridge,
                                                                            support, said):
    guard(bridge, "0.19.2")
    # a 0.6 tree's files (none of the markers), whichever Bridge the suite runs on
    monkeypatch.setattr(T, "installed_sources", lambda: set())
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        mimo_accel.enable(sharded_reads=True)
        mimo_accel.enable(sharded_reads=True, packing=True)
    st = mimo_accel.status()
    assert st["support"] == support and st["shape"] == "0.6" and st["patched"]
    notices = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    assert len(notices) == 1 and f"megatron-bridge {bridge}" in notices[0] and "shape '0.6'" in notices[0]


def _rename_first_parameter_of_the_slice(monkeypatch):
    dp_utils, loaders, step = _sites()

    def slice_batch_for_megatron_mimo(batch, rank, dp_size):  # what a patch release could change
        return batch

    for module in (dp_utils, step, sys.modules[T.DATA_PKG]):
        monkeypatch.setattr(module, "slice_batch_for_megatron_mimo", slice_batch_for_megatron_mimo)


def test_a_newer_patch_release_whose_target_differs_is_refused_naming_it(guard, monkeypatch):
    guard("0.6.3", "0.19.2")
    _rename_first_parameter_of_the_slice(monkeypatch)
    with pytest.raises(PatchError, match=r"slice_batch_for_megatron_mimo: it has no parameter 'dp_rank'.*"
                                         r"megatron-bridge 0\.6\.3"):
        mimo_accel.enable(sharded_reads=True)
    assert mimo_accel.status()["patched"] == []


def test_doctor_lists_the_targets_that_differ(guard, monkeypatch, capsys):
    guard("0.6.3", "0.19.2")
    _rename_first_parameter_of_the_slice(monkeypatch)
    info = doctor.collect()
    assert info["support"].startswith("newer patch release") and not info["refused"]
    assert len(info["differ"]) == 3 and all("slice_batch_for_megatron_mimo: it has no parameter 'dp_rank'" in d
                                            for d in info["differ"])
    assert doctor.main() == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "what differs from shape '0.6'" in out and "no parameter 'dp_rank'" in out


def test_allow_untested_rejects_an_unknown_value(guard, monkeypatch):
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ConfigError, match=f"{ENV}='yes'"):
        mimo_accel.enable(sharded_reads=True)
    assert mimo_accel.status()["patched"] == []


@pytest.mark.megatron
def test_tested_pair_needs_no_opt_in(guard):
    guard("0.6.2", "0.19.2")
    mimo_accel.enable(sharded_reads=True)
    st = mimo_accel.status()
    assert st["support"] == "tested" and st["shape"] == "0.6" and st["patched"]


# -- doctor --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bridge, core, allow, support, rc", [
    ("0.6.2", "0.19.2", None, "tested", 0),
    ("0.6.2", "0.20.0", None, "refused", 1),
    ("0.6.2", "0.20.0", "1", "untested, allowed", 0),
])
def test_doctor_shows_versions_and_the_match(guard, monkeypatch, capsys, bridge, core, allow, support, rc):
    guard(bridge, core)
    if allow:
        monkeypatch.setenv(ENV, allow)
    info = doctor.collect()
    assert (info["megatron-bridge"], info["megatron-core"], info["shape"]) == (bridge, core, "0.6")
    assert info["support"].startswith(support)
    assert doctor.main() == rc
    out = capsys.readouterr().out
    assert support.split(",")[0] in out and core in out


def test_doctor_shows_what_the_environment_turns_on(guard, monkeypatch, capsys, tmp_path):
    """doctor is a process of its own (nothing is enabled in it): it says what MIMO_ACCEL* here turn
    on in a job, and how, or the one line that would stop the job."""
    guard("0.6.2", "0.19.2")
    monkeypatch.setenv("MIMO_ACCEL", "reorder,profile")
    monkeypatch.setenv("MIMO_ACCEL_PROFILE", str(tmp_path / "runs"))
    info = doctor.collect()
    assert info["env_features"] == ["sharded_reads", "reorder", "profile"] and info["env_error"] is None
    assert info["startup_hook"] and info["startup_hook"].endswith("mimo_accel.pth")  # make setup's install has it
    assert doctor.main() == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on from MIMO_ACCEL* here" in out and "sharded_reads │ yes │ yes" in out and "packing │ yes │ no" in out
    assert (f"a Python process started with them turns on sharded_reads, reorder, profile, through the startup hook "
            f"{info['startup_hook']}") in out
    assert mimo_accel.status()["active"] == []  # nothing enabled in doctor's own process
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MIMO_ACCEL_PROFILE", str(tmp_path / "file"))
    assert doctor.main() == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "a job started with them stops at its start: profile=" in out and "is a file, not a directory" in out


def test_doctor_without_torch_says_what_is_missing():
    code = ("import sys; sys.modules['torch'] = None  # as if torch were not installed\n"
            "from mimo_accel.tools import cli; sys.exit(cli.main(['doctor']))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "missing: torch (install the build for this machine first" in " ".join(proc.stdout.split())


# -- the main shape, simulated on the installed 0.6.2 --------------------------------------------


def _upstream_main_pack(data_batch, *, lengths=None):  # main's signature (sequence_pack.py at 067f987)
    raise AssertionError("mimo_accel's packer should have replaced upstream's")


def _upstream_main_resolve(dataset_cfg):  # main's resolve_step_packing
    if not getattr(dataset_cfg, "enable_in_batch_packing", False):
        return False
    if not getattr(dataset_cfg, "defer_in_batch_packing_to_step", False):
        raise ValueError("megatron_mimo_step requires step-time in-batch packing")
    return True


@pytest.fixture
def main_shape(guard, monkeypatch):
    """Bridge main's extra step names grafted onto the installed step module, main's versions faked."""
    _, _, step = _sites()
    seq = types.ModuleType(T.SEQUENCE_PACK)
    seq.pack_language_shard = _upstream_main_pack
    monkeypatch.setitem(sys.modules, T.SEQUENCE_PACK, seq)
    monkeypatch.setattr(step, "pack_language_shard", _upstream_main_pack, raising=False)
    monkeypatch.setattr(step, "resolve_step_packing", _upstream_main_resolve, raising=False)
    guard(*MAIN)
    return step


class _LanguageModel:  # what _get_module_dp_info and mimo_accel's role capture read of a MimoModel
    def __init__(self, first: bool, last: bool):
        self.role = types.SimpleNamespace(has_language_module=True, has_modality_modules=False,
                                          is_first_stage=lambda name: first, is_last_stage=lambda name: last)
        self.mimo_config = types.SimpleNamespace(module_to_grid_map=None)


def _language_model(first: bool, last: bool):
    return _LanguageModel(first, last)


def test_main_shape_packs_with_mimo_accel_packer_in_mains_calling_convention(main_shape):
    step = main_shape
    mimo_accel.enable(packing=True, pad_multiple=4)
    st = mimo_accel.status()
    assert st["shape"] == "main" and st["support"] == "tested"
    assert any(p.endswith("megatron_mimo_step.pack_language_shard") for p in st["patched"])
    # main's forward_step, condensed: resolve, dp info (records the role), slice, lengths, pack
    assert step.resolve_step_packing(types.SimpleNamespace()) is True  # on without a dataset flag
    with pytest.raises(ValueError, match="step-time"):  # upstream's refusal of collate-time packing stays
        step.resolve_step_packing(types.SimpleNamespace(enable_in_batch_packing=True))
    assert step._get_module_dp_info(_language_model(first=True, last=True)) == (0, 1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    batch = {"input_ids": torch.arange(10).view(2, 5), "labels": torch.arange(10).view(2, 5),
             "loss_mask": mask.float(), "attention_mask": mask, "position_ids": None, "modality_inputs": None}
    batch = step.slice_batch_for_megatron_mimo(batch, 0, 1)
    data_batch, packing_kwargs = step.pack_language_shard(batch, lengths=mask.bool().sum(dim=1).long())
    assert data_batch["input_ids"].tolist() == [[0, 1, 2, 0, 5, 6, 0, 0]]  # segments padded to 4
    assert data_batch["attention_mask"] is None and data_batch["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 0, 0]]
    assert packing_kwargs["cu_seqlens_q"].tolist() == [0, 3, 5]
    assert packing_kwargs["cu_seqlens_q_padded"].tolist() == [0, 4, 8]
    from megatron.core.packed_seq_params import PackedSeqParams

    PackedSeqParams(**packing_kwargs)  # what MimoModel builds from data_batch["packing_kwargs"]
    mimo_accel.disable()
    assert step.pack_language_shard is _upstream_main_pack and step.resolve_step_packing is _upstream_main_resolve


def test_main_shape_later_stage_packs_labels_without_input_ids(main_shape):
    step = main_shape
    mimo_accel.enable(packing=True)
    step._get_module_dp_info(_language_model(first=False, last=True))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    batch = {"input_ids": None, "labels": torch.ones(2, 3, dtype=torch.long), "loss_mask": mask.float(),
             "attention_mask": mask, "modality_inputs": None}
    data_batch, kw = step.pack_language_shard(batch, lengths=torch.tensor([2, 3]))
    assert data_batch["input_ids"] is None and data_batch["labels"].shape == (1, 5)
    assert kw["cu_seqlens_kv"].tolist() == [0, 2, 5]


def test_main_shape_packer_without_a_known_role_raises(main_shape):
    step = main_shape
    mimo_accel.enable(packing=True)  # and no _get_module_dp_info call has told the rank's role
    with pytest.raises(RuntimeError, match="_get_module_dp_info"):
        step.pack_language_shard({"attention_mask": torch.ones(1, 2)}, lengths=torch.tensor([2]))


def test_main_shape_refuses_a_mismatched_packer_signature(main_shape, monkeypatch):
    step = main_shape

    def pack_language_shard(batch, lengths=None):  # the parameter name mimo_accel used to expect
        return batch, None

    monkeypatch.setattr(step, "pack_language_shard", pack_language_shard)
    sys.modules[T.SEQUENCE_PACK].pack_language_shard = pack_language_shard
    with pytest.raises(PatchError, match=r"pack_language_shard: it has no parameter 'data_batch'"):
        mimo_accel.enable(packing=True)
    assert mimo_accel.status()["patched"] == []
