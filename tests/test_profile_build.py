"""A profile that says how the job was built: each rank's header records, from the model it trains
(:mod:`mimo_accel.runtime.measuring.job_build`), its module's pipeline split, sequence parallelism,
recompute, precision and the distributed optimizer; ``mimo-accel layout --from`` prices the run with
its split as it ran and takes those settings as the memory model's defaults, each flag given over
them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.recorder import FORMAT
from mimo_accel.runtime.measuring import job_build as jb
from mimo_accel.tools.layout import DataRequest, Request, build, main
from mimo_accel.tools.layout.memory import JobSettings
from mimo_accel.tools.layout.profiled import first_last


def _config(**kw):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**{"num_layers": 8, "hidden_size": 32, "num_attention_heads": 4,
                                "use_cpu_initialization": True, "pipeline_dtype": torch.float32, **kw})


def test_a_record_says_the_split_megatron_builds_and_the_settings_as_configured():
    uneven = jb.settings_of(_config(pipeline_model_parallel_size=3, num_layers_in_first_pipeline_stage=1,
                                    num_layers_in_last_pipeline_stage=3), SimpleNamespace(use_distributed_optimizer=False))
    assert uneven["pipeline_split"] == {"num_layers_in_first_pipeline_stage": 1, "num_layers_in_last_pipeline_stage": 3}
    assert uneven["stage_layers"] == [1, 4, 3] and uneven["distributed_optimizer"] is False
    assert (uneven["precision"], uneven["sequence_parallel"], uneven["recompute_granularity"]) == ("fp32", False, None)
    layout = jb.settings_of(_config(pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Ettttt|tttL"), None)
    assert layout["pipeline_split"] == {"pipeline_model_parallel_layout": "Ettttt|tttL"}
    assert layout["stage_layers"] == [5, 3] and layout["distributed_optimizer"] is None  # no optimizer config: not said
    # the embedding and the loss counted as layers: megatron-core's own count of what each stage builds
    counted = jb.settings_of(_config(num_layers=14, pipeline_model_parallel_size=4,
                                     account_for_embedding_in_pipeline_split=True,
                                     account_for_loss_in_pipeline_split=True), None)
    assert counted["stage_layers"] == [3, 4, 4, 3]
    built = jb.settings_of(_config(tensor_model_parallel_size=2, sequence_parallel=True, bf16=True,
                                   recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
                           SimpleNamespace(use_distributed_optimizer=True))
    assert (built["sequence_parallel"], built["precision"], built["distributed_optimizer"]) == (True, "bf16", True)
    assert (built["recompute_granularity"], built["recompute_method"], built["recompute_num_layers"]) == ("full",
                                                                                                        "block", 2)
    assert built["pipeline_split"] is None and built["stage_layers"] == [8]


def test_the_record_is_read_off_the_modules_a_rank_trains():
    # Bridge's per-module DDP: the language model's wrapper, and an encoder module's (its first encoder's config)
    lm, vit = _config(pipeline_model_parallel_size=2, num_layers_in_first_pipeline_stage=5), _config(num_layers=2)
    language_rank = SimpleNamespace(module=SimpleNamespace(language_model=SimpleNamespace(config=lm),
                                                           modality_submodules={}))
    assert list(jb.job_build(language_rank, None)) == [LANGUAGE]
    assert jb.job_build(language_rank, None)[LANGUAGE]["stage_layers"] == [5, 3]
    encoder_rank = SimpleNamespace(language_model=None, modality_submodules={
        "images": SimpleNamespace(module=SimpleNamespace(encoders={"vit": SimpleNamespace(config=vit)}))})
    state = SimpleNamespace(cfg=SimpleNamespace(optimizer=SimpleNamespace(use_distributed_optimizer=True)))
    got = jb.job_build(encoder_rank, state)
    assert list(got) == ["images"] and got["images"]["num_layers"] == 2 and got["images"]["distributed_optimizer"]


@pytest.mark.parametrize("stages, ends", [((4, 4), (None, None)), ((3, 1), (3, 1)), ((2, 4, 4, 3), (2, 3)),
                                          ((4, 4, 3), (None, 3)), ((5, 4, 3, 4), None), ((8,), (None, None))])
def test_the_stages_become_megatrons_first_last_split_where_one_builds_them(stages, ends):
    assert first_last(stages) == ends


LANGUAGE_SHAPE = {"layers": 4, "hidden": 64, "ffn_hidden": 128, "heads": 4, "query_groups": 4, "kv_channels": 16,
                  "vocab": 512, "causal": True, "merge": 0, "out_hidden": 0}


def _built(stage_layers, **settings) -> dict:
    return {"num_layers": sum(stage_layers), "pipeline_model_parallel_size": len(stage_layers),
            "virtual_pipeline_model_parallel_size": None, "stage_layers": list(stage_layers),
            "pipeline_split": None, "sequence_parallel": False, "recompute_granularity": None, "recompute_method": None,
            "recompute_num_layers": None, "precision": "bf16", "distributed_optimizer": True, **settings}


def _profile(directory: Path, language: dict, vision: dict = None) -> Path:
    """Vision on rank 0, the language model on two stages (ranks 1, 2); each header's build its module's."""
    shape = {**LANGUAGE_SHAPE, "layers": 2, "vocab": 0, "causal": False, "merge": 2, "out_hidden": 64}
    flops = {"device_name": None, "modules": {"vision": {"ranks": 1, "trained": True, "shape": shape},
                                              LANGUAGE: {"ranks": 2, "trained": True, "shape": LANGUAGE_SHAPE}}}
    layout = {"dp": {"vision": 1, LANGUAGE: 1}, "pp": {"vision": 1, LANGUAGE: 2}, "flops": flops}
    for rank, name in enumerate(("vision", LANGUAGE, LANGUAGE)):
        build_record = {name: language if name == LANGUAGE else (vision or _built([2], precision="bf16"))}
        header = {"kind": "header", "format": FORMAT, "rank": rank, "world_size": 3, "module": name, "dp_rank": 0,
                  "dp_size": 1, "layout": layout, "build": build_record, "device": "cpu",
                  "versions": {"megatron-bridge": "0.7.0"}}
        lines = [header]
        for s in range(4):
            line = {"kind": "step", "step": s, "step_time_s": 1.0, "samples": 8, "timed_calls": {f"{name}_fwd": 2}}
            if rank == 2 and s == 3:
                line["online_refits"] = [
                    {"step": 3, "module": m, "coefficients": {"a": 1e-4, "b": 1e-7, "k": 0.0}, "accepted": True}
                    for m in ("vision", LANGUAGE)]
            lines.append(line)
        (directory / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def _request(run: Path, **settings) -> Request:
    return Request(profile=str(run), data=DataRequest("receipts", rehearsal=True, steps=1), **settings)


def test_layout_from_prices_the_run_with_its_split_and_its_memory_settings(tmp_path):
    language = _built([3, 1], sequence_parallel=True, recompute_granularity="selective", distributed_optimizer=False,
                      pipeline_split={"num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 1})
    problem = build(_request(_profile(tmp_path, language)))
    assert (problem.profiled.first, problem.profiled.last) == (3, 1)
    assert problem.profiled.spec == "vision=tp1,pp1,dp1 language=tp1,pp2,dp1 mbs=4 gbs=8 first=3 last=1"
    s = problem.settings
    assert (s.sequence_parallel, s.recompute, s.distributed_optimizer, s.precision) == (True, "selective", False,
                                                                                         "bf16")
    assert "built configs in" in s.source
    said = next(n for n in problem.notes if n.startswith("memory settings from the profile: "))
    assert said == ("memory settings from the profile: sequence parallelism on, recompute selective, the distributed "
                    "optimizer off, precision bf16 (as the run was built)")
    # a flag given is over the profile's, the others stay as the run was built
    over = build(_request(tmp_path, settings=JobSettings(sequence_parallel=False, source="the command line"),
                          settings_given=("sequence_parallel",)))
    assert (over.settings.sequence_parallel, over.settings.recompute, over.settings.distributed_optimizer) == (
        False, "selective", False)
    assert "the command line's sequence_parallel over it" in over.settings.source


def test_the_console_says_where_the_memory_settings_come_from(tmp_path):
    language = _built([3, 1], recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1,
                      pipeline_split={"num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 1})
    (tmp_path / "run").mkdir()
    run = _profile(tmp_path / "run", language)
    console = Console(width=250, record=True)
    assert main(["--from", str(run), "--workload", "receipts", "--rehearsal", "--steps", "1", "--no-distributed-optimizer",
                 "--json", str(tmp_path / "a.json")], console=console) == 0
    text = console.export_text()
    assert ("memory settings from the profile: sequence parallelism off, recompute full, the distributed optimizer on, "
            "precision bf16 (as the run was built); given on the command line over them: the distributed optimizer "
            "off") in text
    assert "memory as configured: sequence parallelism off, recompute full, distributed optimizer off" in text
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["current"]["spec"].endswith("first=3 last=1") and doc["current"]["pipeline_split"] == {
        "num_layers_in_first_pipeline_stage": 3, "num_layers_in_last_pipeline_stage": 1}
    assert doc["assumptions"]["recompute"] == "full" and doc["assumptions"]["distributed_optimizer"] is False


def test_a_profile_that_does_not_say_how_it_was_built_is_priced_even_and_says_so(tmp_path):
    run = _profile(tmp_path, _built([2, 2]))
    for path in run.glob("rank*.jsonl"):
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        header.pop("build")
        path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    problem = build(_request(run))
    assert problem.profiled.first is None and problem.settings == JobSettings()  # the launcher's
    assert any("does not say how its layers were split over its 2 stages" in n for n in problem.notes)
    assert not any(n.startswith("memory settings from the profile") for n in problem.notes)
    # a layout no first / last pair builds: said, priced even
    odd = _profile(tmp_path, _built([1, 3], pipeline_split={"pipeline_model_parallel_layout": "Et|tttL"}))
    assert build(_request(odd)).profiled.spec.endswith("first=1 last=3")  # two stages: any pair builds it


@pytest.mark.distributed
def test_a_rehearsed_uneven_split_with_recompute_is_priced_as_it_ran(tmp_path):
    """Bridge's loop on CPU ranks (vision dp1 -> language pp2 with megatron-core's first/last split 5 / 1 and
    selective recompute, mimo_accel on, 8 steps, every rank on one CPU), then ``layout --from`` its profile
    and its own cost index. The CPU stack cannot run sequence parallelism: megatron-core's local layer spec
    norms with torch's LayerNorm (``WrappedTorchNorm``), which refuses it (Transformer Engine's or Apex's
    norm needed), so the profile says it off and the test holds it so."""
    from mimo_accel.profiler.run import read_run
    from mimo_accel_dev.commands.rehearsal_output import progress_bar
    from mimo_accel_dev.rehearse import rehearsal

    steps, gbs = 8, 16
    argv = ["--gbs", str(gbs), "--language-pp", "2", "--language-layers", "6", "--vision-layers", "1",
            "--language-first-stage-layers", "5", "--language-last-stage-layers", "1", "--language-recompute", "selective"]
    cache = tmp_path / "cache"
    with progress_bar(Console(file=open(tmp_path / "progress.txt", "w"))) as progress:
        task = progress.add_task("uneven", total=steps)
        records = rehearsal.run_bridge("uneven", rehearsal.ALL_FEATURES, 1, 1, steps, 4, tmp_path, tmp_path / "images",
                                       None, 0, progress, task, tmp_path / "log.txt", cpus=rehearsal.one_cpu(),
                                       extra_argv=argv, language_ranks=2, env={"MIMO_ACCEL_CACHE_DIR": str(cache)})
    assert {r["pp_rank"]: r["layer_numbers"] for r in records if r["module"] == LANGUAGE} == {0: [1, 2, 3, 4, 5],
                                                                                           1: [6]}
    # every rank's header: its module as built, read off the model it trained
    run = read_run(tmp_path / "uneven")
    language = [log.header["build"][LANGUAGE] for log in run.ranks.values() if log.module == LANGUAGE]
    assert len(language) == 2 and all(b == language[0] for b in language)
    assert language[0]["pipeline_split"] == {"num_layers_in_first_pipeline_stage": 5,
                                             "num_layers_in_last_pipeline_stage": 1}
    assert language[0]["stage_layers"] == [5, 1] and language[0]["recompute_granularity"] == "selective"
    assert (language[0]["sequence_parallel"], language[0]["precision"], language[0]["distributed_optimizer"]) == (
        False, "fp32", False)  # the example's CPU optimizer: fp32, not distributed
    (vision,) = [log.header["build"] for log in run.ranks.values() if log.module == "vision"]
    assert list(vision) == ["vision"] and vision["vision"]["recompute_granularity"] is None

    (index,) = cache.glob("*.npz")
    console = Console(width=250, record=True)
    assert main(["--from", str(tmp_path / "uneven"), "--index", str(index), "--seq-length", str(rehearsal.BRIDGE_SEQ),
                 "--json", str(tmp_path / "advice.json")], console=console) == 0
    doc = json.loads((tmp_path / "advice.json").read_text())
    assert doc["current"]["spec"] == "vision=tp1,pp1,dp1 language=tp1,pp2,dp1 mbs=4 gbs=16 first=5 last=1"
    assert doc["assumptions"]["recompute"] == "selective" and doc["assumptions"]["distributed_optimizer"] is False
    assert ("memory settings from the profile: sequence parallelism off, recompute selective, the distributed "
            "optimizer off, precision fp32") in console.export_text()
    # priced as it ran, before any scale to its replay: within 10 % of the step its measured times replay
    problem = build(Request(profile=str(tmp_path / "uneven"),
                            data=DataRequest(index=str(index), seq_length=rehearsal.BRIDGE_SEQ)))
    assert any(n.startswith("each module's compute costs x") for n in problem.notes)  # the run was replayed, fitted
    modelled_over_replayed = 1.0 / problem.seconds.scale
    assert abs(modelled_over_replayed - 1.0) <= 0.10, modelled_over_replayed
