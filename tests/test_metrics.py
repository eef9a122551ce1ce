"""mimo_accel's per-step figures in Bridge's writers (mimo_accel.runtime.measuring.metrics), without ranks:
the figures from real Recorder step lines, the gather through a real torch.distributed store, the
scalars read back from a real TensorBoard event file with tensorboard's own reader."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from mimo_accel.profiler import Recorder
from mimo_accel.runtime.measuring.metrics import Metrics
from mimo_accel.runtime.measuring.step_figures import rank_figures, step_scalars


def _line(tmp_path, rank, module, dp_rank, fwd, bwd, *, read=4, nbytes=1000, tokens=0, spreads=None):
    """One real step line of a rank (Recorder, wall clock), and its header."""
    rec = Recorder(tmp_path / f"r{rank}", rank=rank, world_size=8, module=module, dp_rank=dp_rank, dp_size=4,
                   clock="wall", device="cpu", regions=(f"{module}_fwd", f"{module}_bwd"))
    rec._regions.update({f"{module}_fwd": fwd, f"{module}_bwd": bwd})  # the seconds a timer would have added
    rec.add(samples_read=read, bytes_read=nbytes, tokens=tokens)
    if spreads:
        rec.set(predicted_spreads=spreads, predicted_spread=max(spreads.values()))
    record = rec.end_step()
    rec.close()
    return rec.header, record


def _figures(tmp_path, spreads=None):
    """vision dp2 (rank 1 twice as slow; ranks 0, 1), language dp2 with TP2 (ranks 2-5: replica 0
    on 2, 3; replica 1 on 4, 5)."""
    out = [rank_figures(*_line(tmp_path, 0, "vision", 0, 0.1, 0.2, spreads=spreads)),
           rank_figures(*_line(tmp_path, 1, "vision", 1, 0.2, 0.4, spreads=spreads))]
    for rank, dp, t, tokens in ((2, 0, 0.5, 300), (3, 0, 0.6, 300), (4, 1, 0.3, 100), (5, 1, 0.3, 100)):
        out.append(rank_figures(*_line(tmp_path, rank, "language", dp, t, t, read=8, nbytes=500, tokens=tokens,
                                       spreads=spreads)))
    return out


def test_step_scalars_are_the_reports_definitions_for_one_step(tmp_path):
    s = step_scalars(_figures(tmp_path, spreads={"vision": 1.02, "language": 1.3}))
    p = "mimo_accel"
    # vision: replica times 0.3 and 0.6 -> max/mean 0.6/0.45
    assert s[f"{p}/vision/straggler"] == pytest.approx(0.6 / 0.45)
    assert s[f"{p}/vision/slowest_replica_s"] == pytest.approx(0.6)
    assert s[f"{p}/vision/slowest_replica"] == 1
    # language: a replica's time is the max over its TP ranks: 1.2 and 0.6
    assert s[f"{p}/language/straggler"] == pytest.approx(1.2 / 0.9)
    assert s[f"{p}/language/slowest_replica"] == 0
    assert s[f"{p}/vision/straggler_planned"] == 1.02 and s[f"{p}/language/straggler_planned"] == 1.3
    assert s[f"{p}/language/tokens_max"] == 300 and s[f"{p}/language/tokens_mean"] == 200
    assert s[f"{p}/language/tokens_straggler"] == pytest.approx(300 / 200)
    assert s[f"{p}/vision/samples_read_per_rank"] == 4 and s[f"{p}/language/samples_read_per_rank"] == 8
    assert s[f"{p}/vision/bytes_read_per_rank"] == 1000
    assert s[f"{p}/reads/samples"] == 2 * 4 + 4 * 8
    assert s[f"{p}/reads/bytes"] == 2 * 1000 + 4 * 500
    assert s[f"{p}/reads/bytes_exchanged"] == 0


def test_without_a_plan_there_is_no_planned_figure_and_one_number_is_the_encoders(tmp_path):
    plain = step_scalars(_figures(tmp_path))
    assert not [k for k in plain if k.endswith("straggler_planned")]
    header, record = _line(tmp_path, 0, "images", 0, 0.1, 0.1)
    fig = rank_figures(header, dict(record, predicted_spread=1.07))
    assert step_scalars([fig])["mimo_accel/images/straggler_planned"] == 1.07


def test_the_longest_wait_for_a_plan_is_the_steps(tmp_path):
    figures = _figures(tmp_path, spreads={"vision": 1.02, "language": 1.3})
    assert "mimo_accel/plan_wait_s" not in step_scalars(figures)  # no rank waited for a plan made ahead
    for f, wait in zip(figures, (0.0, 0.004, 0.0, 0.0, 0.125, 0.0)):
        f["plan_wait_s"] = wait
    assert step_scalars(figures)["mimo_accel/plan_wait_s"] == 0.125


def test_no_tag_grows_with_the_data_parallel_size(tmp_path):
    """DP 512: as many tags as at DP 2 (the tokens per replica are one histogram), written through a
    stand-in of Bridge's writers."""
    from mimo_accel.runtime.measuring.metrics import step_histograms

    def tags(dp):
        figures = [rank_figures({"rank": r, "module": "language", "dp_rank": r},
                                {"language_fwd_s": 0.1 + r * 1e-3, "language_bwd_s": 0.1, "tokens": 100 + r,
                                 "samples_read": 4}) for r in range(dp)]
        return set(step_scalars(figures)) | set(step_histograms(figures)), step_histograms(figures)

    small, _ = tags(2)
    large, histograms = tags(512)
    assert large == small
    assert histograms["mimo_accel/language/tokens"] == [100 + r for r in range(512)]


def test_a_rank_of_no_known_module_counts_in_the_reads_only(tmp_path):
    header, record = _line(tmp_path, 0, "unknown", 0, 0.1, 0.1)
    s = step_scalars([rank_figures(header, record)])
    assert not [k for k in s if k.startswith("mimo_accel/unknown/")] and s["mimo_accel/reads/samples"] == 4


def test_an_untimed_module_has_no_straggler_but_its_reads(tmp_path):
    header, record = _line(tmp_path, 0, "vision", 0, 0.0, 0.0)
    fig = rank_figures(header, dict(record, vision_fwd_s=None, vision_bwd_s=None))
    s = step_scalars([fig])
    assert "mimo_accel/vision/straggler" not in s and s["mimo_accel/vision/samples_read_per_rank"] == 4


def test_each_modules_throughput_is_a_scalar_of_the_step():
    """vision dp2 (64 and 32 rows); language dp2 on TP2 (replica 0: 300 real tokens, replica 1:
    100, counted alike on both TP ranks); the step: the longest any rank took (2 s)."""
    from mimo_accel.costs.flops import FlopsShape

    vit = FlopsShape(layers=2, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16, causal=False)
    lm = FlopsShape(layers=4, hidden=128, ffn_hidden=512, heads=4, query_groups=4, kv_channels=32, vocab=2048)
    flops = {"device_name": "NVIDIA H100 80GB HBM3",
             "modules": {"vision": {"ranks": 2, "trained": True, "shape": vit.to_dict()},
                         "language": {"ranks": 4, "trained": True, "shape": lm.to_dict()}}}
    figures = []
    for rank, module, dp, seconds, rows in ((0, "vision", 0, 1.5, 64), (1, "vision", 1, 2.0, 32),
                                            (2, "language", 0, 2.0, 300), (3, "language", 0, 1.9, 300),
                                            (4, "language", 1, 2.0, 100), (5, "language", 1, 1.8, 100)):
        names = ("tokens", "sq_tokens") if module == "language" else ("vision_rows", "vision_sq_rows")
        record = {"step_time_s": seconds, "samples": 4, names[0]: rows, names[1]: rows * rows}
        figures.append(rank_figures({"rank": rank, "module": module, "dp_rank": dp}, record))
    s = step_scalars(figures, flops)
    p = "mimo_accel"
    assert s[f"{p}/language/samples_per_s"] == s[f"{p}/vision/samples_per_s"] == 8 / 2.0
    assert s[f"{p}/language/tokens_per_s_per_gpu"] == 400 / (2.0 * 4)
    assert s[f"{p}/vision/tokens_per_s_per_gpu"] == 96 / (2.0 * 2)
    tflops = 3 * lm.forward(400, 300**2 + 100**2) / (2.0 * 4) / 1e12
    assert s[f"{p}/language/tflops_per_gpu"] == pytest.approx(tflops)
    assert s[f"{p}/language/mfu"] == pytest.approx(tflops / 989.0)  # an H100 SXM's dense BF16 peak
    assert s[f"{p}/vision/tflops_per_gpu"] == pytest.approx(3 * vit.forward(96, 64**2 + 32**2) / (2.0 * 2) / 1e12)
    on_cpu = step_scalars(figures, {**flops, "device_name": None})
    assert not [k for k in on_cpu if k.endswith("/mfu")] and f"{p}/language/tflops_per_gpu" in on_cpu
    shapeless = step_scalars(figures)  # no FLOPs shapes: no FLOPs; per GPU over the ranks that reported
    assert not [k for k in shapeless if k.endswith(("/tflops_per_gpu", "/mfu"))]
    assert shapeless[f"{p}/language/tokens_per_s_per_gpu"] == 400 / (2.0 * 4)


class _Writer:
    """Bridge's writers stand-in where only the calls matter."""

    def __init__(self):
        self.scalars: list = []
        self.logged: list = []

    def add_scalar(self, name, value, step):
        self.scalars.append((name, value, step))

    def add_histogram(self, name, values, step):
        self.scalars.append((name, list(values), step))

    def log(self, values, step):
        self.logged.append((values, step))


def _state(*, step=0, interval=1, tensorboard=None, wandb=None, tb_dir="tb", project=None):
    logger_cfg = SimpleNamespace(log_interval=interval, tensorboard_dir=tb_dir, wandb_project=project,
                                 skip_train_metrics_log=False)
    return SimpleNamespace(cfg=SimpleNamespace(logger=logger_cfg), train_state=SimpleNamespace(step=step),
                           tensorboard_logger=tensorboard, wandb_logger=wandb)


def test_the_ranks_meet_in_the_store_and_only_the_last_rank_writes(tmp_path):
    """Four ranks' hooks on one real store (HashStore): every rank's hook only sets its figures and
    goes on — the writing rank (3, Bridge's) too: its thread waits for ranks 0-2 and writes, and
    its close collects that; no key is left behind."""
    store = dist.HashStore()
    lines = [_line(tmp_path, r, "vision" if r < 2 else "language", r % 2, 0.1 * (r + 1), 0.1, tokens=50 * r)
             for r in range(4)]
    tb, wb = _Writer(), _Writer()
    states = [_state(step=1, tensorboard=tb if r == 3 else None, wandb=wb if r == 3 else None) for r in range(4)]
    ranks = [Metrics(states[r], rank=r, world=4, store=store) for r in range(4)]
    assert len({m.run for m in ranks}) == 4  # one process plays four ranks here: four runs' keys
    for m in ranks:
        m.run = 7  # the same run on every rank, as in a job
    ranks[3].after_step(*lines[3])  # returns before ranks 0-2 have come: the wait is on its own thread
    assert ranks[3].written == 0 and not store.check(["mimo_accel/metrics/7/done"])
    for r in range(3):
        ranks[r].after_step(*lines[r])  # returns at once: only a set
    ranks[3].close()  # collects the gather: written
    assert ranks[3].written == 1 and all(m.written == 0 for m in ranks[:3])
    names = {name for name, _, step in tb.scalars if step == 2}  # iteration 2: train_state.step + 1
    assert {"mimo_accel/vision/straggler", "mimo_accel/language/straggler", "mimo_accel/reads/samples",
            "mimo_accel/language/tokens_max", "mimo_accel/language/tokens"} <= names
    assert ("mimo_accel/language/tokens", [100, 150], 2) in tb.scalars  # one histogram: replicas 0 (rank 2), 1
    assert wb.logged and wb.logged[0][1] == 2 and set(wb.logged[0][0]) == names - {"mimo_accel/language/tokens"}
    # each rank deletes its own key once the writer marked the iteration read: ranks 0 and 1 looked
    # before the writer could (it waits for rank 2's key), so theirs stay until their next logged
    # iteration or the end of training; rank 2 looks right after its set, before or after the writer
    # marked the iteration (the two threads race), so its key may already be gone; the writer's own
    # key went when it read them all
    left = [r for r in range(4) if store.check([f"mimo_accel/metrics/7/2/{r}"])]
    assert left in ([0, 1], [0, 1, 2]) and store.num_keys() == 1 + len(left)  # and the done mark
    for m in ranks:
        m.close()
    assert store.num_keys() == 1 and int(store.get("mimo_accel/metrics/7/done")) == 2


def test_only_the_iterations_bridge_logs_are_gathered(tmp_path):
    store = dist.HashStore()
    tb = _Writer()
    state = _state(interval=3, tensorboard=tb)
    m = Metrics(state, rank=0, world=1, store=store)
    line = _line(tmp_path, 0, "vision", 0, 0.1, 0.1)
    for step in range(7):  # iterations 1..7: 3 and 6 are logged
        state.train_state.step = step
        m.after_step(*line)
    assert sorted({s for _, _, s in tb.scalars}) == [3, 6] and m.written == 2
    assert store.num_keys() == 1  # only the done mark: the writer deletes its own key at once
    m.close()


def test_a_rank_that_never_comes_is_named(tmp_path):
    """On the training thread: at the writing rank's next optimizer step, or at the end of training."""
    store = dist.HashStore()
    store.set_timeout(__import__("datetime").timedelta(milliseconds=200))
    state = _state(tensorboard=_Writer())
    m = Metrics(state, rank=1, world=2, store=store)
    line = _line(tmp_path, 1, "language", 0, 0.1, 0.1)
    m.after_step(*line)
    state.train_state.step = 1
    with pytest.raises(RuntimeError, match=r"ranks \[0\] never reached the end of iteration 1"):
        m.after_step(*line)
    m.after_step(*line)  # iteration 2 again (the error stopped the step before its own figures): in flight
    with pytest.raises(RuntimeError, match=r"ranks \[0\] never reached the end of iteration 2"):
        m.close()
    assert m.written == 0


def test_the_writing_ranks_thread_writes_tensorboard_and_its_training_thread_wandb_in_order(tmp_path):
    store = dist.HashStore()
    threads: dict = {"tb": set(), "wandb": set()}

    class Recording(_Writer):
        def add_scalar(self, name, value, step):
            threads["tb"].add(threading.current_thread().name)
            super().add_scalar(name, value, step)

        def log(self, values, step):
            threads["wandb"].add(threading.current_thread().name)
            super().log(values, step)

    tb, wb = Recording(), Recording()
    state = _state(tensorboard=tb, wandb=wb)
    m = Metrics(state, rank=0, world=1, store=store)
    for step in range(5):
        state.train_state.step = step
        m.after_step(*_line(tmp_path, 0, "vision", 0, 0.1 * (step + 1), 0.1))
        assert [s for _, s in wb.logged] == list(range(1, step + 1))  # the iteration before, collected
    m.close()
    assert [s for _, s in wb.logged] == [1, 2, 3, 4, 5] and m.written == 5
    assert sorted({s for _, _, s in tb.scalars}) == [1, 2, 3, 4, 5]
    assert threads["wandb"] == {threading.main_thread().name}
    assert threads["tb"] == {"mimo-accel-metrics"}  # one thread for the run
    assert not [t for t in threading.enumerate() if t.name.startswith("mimo-accel-metrics")]  # none left
    assert store.num_keys() == 1


def test_bridges_lazily_made_writer_is_made_on_the_training_thread_only(tmp_path):
    """GlobalState makes its SummaryWriter on first access: two threads asking at once made two
    event files; the metrics thread gets the writer from the training thread."""
    made = []

    class LazyState:
        cfg = SimpleNamespace(logger=SimpleNamespace(log_interval=1))
        train_state = SimpleNamespace(step=0)
        wandb_logger = None
        _writer = None

        @property
        def tensorboard_logger(self):
            made.append(threading.current_thread().name)
            if LazyState._writer is None:
                LazyState._writer = _Writer()
            return LazyState._writer

    state = LazyState()
    m = Metrics(state, rank=0, world=1, store=dist.HashStore())
    for step in range(3):
        state.train_state.step = step
        m.after_step(*_line(tmp_path, 0, "vision", 0, 0.1, 0.1))
    m.close()
    assert set(made) == {threading.main_thread().name} and m.written == 3
    assert sorted({s for _, _, s in LazyState._writer.scalars}) == [1, 2, 3]


def test_a_failed_run_does_not_wait_for_its_gather(tmp_path):
    store = dist.HashStore()
    store.set_timeout(__import__("datetime").timedelta(seconds=300))
    m = Metrics(_state(tensorboard=_Writer()), rank=1, world=2, store=store)
    m.after_step(*_line(tmp_path, 1, "language", 0, 0.1, 0.1))  # rank 0 never comes
    (thread,) = [t for t in threading.enumerate() if t.name == "mimo-accel-metrics"]
    assert thread.daemon  # it cannot keep the process alive
    m.abandon()  # returns within a short wait of the store, long before its 300 s timeout
    assert not thread.is_alive()
    m.close()  # nothing left to collect
    assert m.written == 0


@pytest.mark.parametrize("logger_cfg", [dict(tb_dir=None), dict(tb_dir="", project=""), "skip"])
def test_a_logger_that_writes_nowhere_gathers_nothing(logger_cfg):
    state = _state(**logger_cfg) if logger_cfg != "skip" else _state()
    if logger_cfg == "skip":
        state.cfg.logger.skip_train_metrics_log = True
    assert Metrics.for_run(state) is None


def test_scalars_in_a_real_event_file_read_back_by_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    state = _state(tensorboard=writer)
    m = Metrics(state, rank=0, world=1, store=dist.HashStore())
    for step in range(3):
        state.train_state.step = step
        m.after_step(*_line(tmp_path, 0, "vision", 0, 0.1 * (step + 1), 0.1))
    m.close()  # the end of training: the last logged iteration written
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("mimo_accel/vision/slowest_replica_s")]
    assert [s for s, _ in got] == [1, 2, 3]
    assert [v for _, v in got] == pytest.approx([0.2, 0.3, 0.4])
    assert [e.value for e in acc.Scalars("mimo_accel/reads/samples")] == [4, 4, 4]


def test_the_train_entry_hands_global_state_to_the_profiler(tmp_path, monkeypatch):
    from mimo_accel.config import AccelConfig
    from mimo_accel.runtime.measuring.profiling import Profiling
    from mimo_accel.runtime.patches.profiler import wrap_train_entry
    from mimo_accel.runtime.state import Runtime

    seen = []

    def train_megatron_mimo(forward_step_func, model, optimizer, schedulers, train_data_iterator,
                            valid_data_iterator, global_state, megatron_mimo_infra=None):
        seen.append(runtime.profiling.metrics)

    runtime = Runtime(AccelConfig(profile=str(tmp_path)))
    runtime.profiling = Profiling(runtime)
    wrapped = wrap_train_entry(train_megatron_mimo, runtime)
    made, closed = [], []

    class _Run:
        def close(self):
            closed.append(self)

    monkeypatch.setattr(Metrics, "for_run", classmethod(lambda cls, gs, calibration: made.append(gs) or _Run()))
    wrapped(None, None, None, None, None, None, "state-positional")
    wrapped(forward_step_func=None, model=None, optimizer=None, schedulers=None, train_data_iterator=None,
            valid_data_iterator=None, global_state="state-keyword")
    assert made == ["state-positional", "state-keyword"] and seen == closed and len(closed) == 2
    assert runtime.profiling.metrics is None  # training ended: the run's metrics closed and gone


def test_the_gather_benchmark_runs(monkeypatch, capsys):
    from tests.test_benchmarks_run import run_here

    # in this process: a process of its own would spend its time importing torch
    run_here("bench_metrics.py", ["--ranks", "4", "--repeat", "1", "--step", "0.05"], monkeypatch)
    assert capsys.readouterr().out.splitlines()[-1].split()[0] == "4"


def test_a_ranks_figures_carry_its_modules_pp_stages_from_the_header(tmp_path):
    # the online calibration sums a replica's stages (runtime.calibration.step_observations)
    header, record = _line(tmp_path, 2, "language", 0, 0.5, 0.5, tokens=300)
    assert rank_figures(header, record)["stages"] == 1  # a header without a layout: one stage
    staged = dict(header, layout={"dp": {"language": 4}, "pp": {"language": 2, "vision": 1}})
    assert rank_figures(staged, record)["stages"] == 2


def _lone_encoder_line(tmp_path, dp_size, calls):
    """A vision rank's real step line: ``calls`` forwards of (rows, seconds), each with its counts."""
    rec = Recorder(tmp_path / f"lone{dp_size}", rank=0, world_size=4, module="vision", dp_size=dp_size,
                   clock="wall", device="cpu", regions=("vision_fwd", "vision_bwd"))
    for rows, _ in calls:
        with rec.time("vision_fwd"):
            pass
        with rec.time("vision_bwd"):
            pass
        rec.add_micro(vision_items=1, vision_rows=rows, vision_sq_rows=rows * rows)
    record = rec.end_step()
    record["micro"]["vision_fwd"] = [s / 3 for _, s in calls]  # the seconds the timers would have taken
    record["micro"]["vision_bwd"] = [2 * s / 3 for _, s in calls]
    rec.close()
    return rec.header, record


def test_a_lone_encoder_replica_gives_its_micro_batches_and_others_do_not(tmp_path):
    calls = [(10, 0.3), (40, 0.9)]
    micro = rank_figures(*_lone_encoder_line(tmp_path, 1, calls))["micro"]
    assert micro["features"] == [[10, 100, 1], [40, 1600, 1]] and micro["seconds"] == pytest.approx([0.3, 0.9])
    assert rank_figures(*_lone_encoder_line(tmp_path, 2, calls))["micro"] is None  # replicas are its observations
    header, record = _lone_encoder_line(tmp_path, 1, calls)
    record["micro"]["vision_rows"].pop()  # a count without its time: nothing pairs
    assert rank_figures(header, record)["micro"] is None
    assert rank_figures(*_line(tmp_path, 5, "language", 0, 0.1, 0.1))["micro"] is None


def test_a_language_rank_gives_its_micro_batches_under_a_step_plan_whatever_its_replicas(tmp_path):
    # every language replica's micro-batches hold as many samples: their level beside their tokens
    # tells what a micro-batch costs whatever its length (a step plan's online calibration's k)
    rec = Recorder(tmp_path / "lang", rank=3, world_size=8, module="language", dp_rank=1, dp_size=2,
                   clock="wall", device="cpu", regions=("language_fwd", "language_bwd"))
    for tokens in (30, 200):
        with rec.time("language_fwd"):
            pass
        with rec.time("language_bwd"):
            pass
        rec.add(samples=2, tokens=tokens, sq_tokens=tokens * tokens)
        rec.add_micro(tokens=tokens, sq_tokens=tokens * tokens)
    record = rec.end_step()
    record["micro"]["language_fwd"], record["micro"]["language_bwd"] = [0.1, 0.2], [0.2, 0.4]
    rec.close()
    figures = rank_figures(rec.header, record, language_micro=True)
    assert figures["features"] == [230, 30 * 30 + 200 * 200, 4]
    assert figures["micro"]["features"] == [[30, 900, 2], [200, 40000, 2]]
    assert figures["micro"]["seconds"] == pytest.approx([0.3, 0.6])
    assert rank_figures(rec.header, record)["micro"] is None  # no step plan: none gathered
    record["samples"] = 3  # samples that do not split evenly over its micro-batches: no per-micro-batch rows
    assert rank_figures(rec.header, record, language_micro=True)["micro"] is None


# ---------------------------------------------------------------------- who bounds the step
# Upstream's validated layout in small, as tests/test_replay.py works it by hand: images dp1 (rank 0)
# -> language dp2 pp2 (TP2 here: rank 1 + stage·4 + replica·2 + tp), two micro-batches; the encoder
# (2, 4) s a micro-batch, a language stage (1, 2) s: a 16 s step, the encoder busy 12 s of it, each
# language stage 6 s.

VALIDATED = {"dp": {"images": 1, "language": 2}, "pp": {"images": 1, "language": 2}}


def _timed_line(tmp_path, rank, module, dp_rank, fwd, bwd):
    """A rank's real step line (Recorder), its micro-batches' seconds as the timers would have taken them."""
    rec = Recorder(tmp_path / f"t{rank}", rank=rank, world_size=9, module=module, dp_rank=dp_rank,
                   dp_size=1 if module == "images" else 2, layout=VALIDATED, clock="wall", device="cpu",
                   regions=(f"{module}_fwd", f"{module}_bwd"))
    for _ in fwd:
        with rec.time(f"{module}_fwd"):
            pass
        with rec.time(f"{module}_bwd"):
            pass
    record = rec.end_step()
    record["micro"].update({f"{module}_fwd": list(fwd), f"{module}_bwd": list(bwd)})
    rec.close()
    return rec.header, record


def _validated_lines(tmp_path):
    lines = [_timed_line(tmp_path, 0, "images", 0, [2.0, 2.0], [4.0, 4.0])]
    for rank in range(1, 9):  # a TP pair's second rank is faster: the op takes its slower rank's time
        slow = rank % 2 == 1
        lines.append(_timed_line(tmp_path, rank, "language", (rank - 1) // 2 % 2,
                                 [1.0, 1.0] if slow else [0.5, 0.1], [2.0, 2.0] if slow else [1.0, 1.5]))
    return lines


def test_each_modules_busy_share_is_the_replayed_steps(tmp_path):
    lines = _validated_lines(tmp_path)
    assert rank_figures(*lines[0])["micro_us"] is None  # only an iteration that is written carries its times
    figures = [rank_figures(*line, times=True) for line in lines]
    assert figures[0]["micro_us"] == {"fwd": [2_000_000, 2_000_000], "bwd": [4_000_000, 4_000_000]}
    s = step_scalars(figures)
    assert s["mimo_accel/images/busy_share"] == pytest.approx(0.75)
    assert s["mimo_accel/language/busy_share"] == pytest.approx(6 / 16)
    figures[8]["micro_us"] = None  # a rank without its times: no replay, no share
    assert not [k for k in step_scalars(figures) if k.endswith("/busy_share")]


def test_the_busy_shares_reach_a_real_event_file_and_only_written_iterations_carry_times(tmp_path):
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    store = dist.HashStore()
    lines = _validated_lines(tmp_path)
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    states = [_state(interval=2, tensorboard=writer if r == 8 else None) for r in range(9)]
    # gathered every iteration (as with online calibration), written every second one
    ranks = [Metrics(states[r], rank=r, world=9, store=store, calibration=SimpleNamespace(lead=1, language_per_micro_batch=False) if r < 8 else None)
             for r in range(9)]
    for m in ranks:
        m.run = 7
    states[0].train_state.step = 0  # iteration 1: gathered, not written
    ranks[0].after_step(*lines[0])
    assert json.loads(store.get("mimo_accel/metrics/7/1/0"))["micro_us"] is None
    for step in (1, 3):  # iterations 2 and 4: written
        for r, m in enumerate(ranks):
            states[r].train_state.step = step
            m.after_step(*lines[r])
    ranks[8].close()
    writer.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    for module, share in (("images", 0.75), ("language", 6 / 16)):
        got = [(e.step, e.value) for e in acc.Scalars(f"mimo_accel/{module}/busy_share")]
        assert [s for s, _ in got] == [2, 4] and [v for _, v in got] == pytest.approx([share, share])
