"""The checkpoint a run resumes from, checked before Bridge loads it (mimo_accel.runtime.resume).

Each checkpoint here is what Bridge leaves beside a real one: the run's ``ConfigContainer`` written by
Bridge's own ``to_yaml`` as ``iter_NNNNNNN/run_config.yaml`` and the Megatron-LM tracker, for configs
the example training script builds (no weights: the check reads the config only, and stops before
the load). Each bad case is refused in one line naming the fix; a resume that can go on is not.
(The same checks on Bridge's own loop, with real checkpoints: tests/test_resume_switch.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mimo_accel.runtime.resume import ResumeRefused, check_before_load, check_order, iteration_directory


def _config(*flags: str, save: str = "/ckpt", load=None):
    """The example's config; a resume drops the RNG states (kept per TP/PP rank: the test of that below)."""
    from mimo_accel_dev.rehearse import bridge_script as bs

    args = bs.parse_args(["--cpu", "--mbs", "2", "--gbs", "8", "--save", save,
                          *(["--load", str(load), "--no-load-rng"] if load else []), *flags])
    return bs.build_config(args, bs.build_layout(args))


REFERENCE = ("--vision-dp", "1", "--language-dp", "2", "--language-tp", "2", "--language-pp", "2")
OTHER = ("--vision-dp", "2", "--language-dp", "1", "--language-tp", "1", "--language-pp", "2")


def _saved(tmp_path: Path, cfg, iteration: int = 3) -> Path:
    """``cfg``'s run saved at ``iteration`` as Bridge lays it out (config and tracker)."""
    root = tmp_path / "ckpt"
    (root / f"iter_{iteration:07d}").mkdir(parents=True)
    cfg.to_yaml(str(root / f"iter_{iteration:07d}" / "run_config.yaml"))
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root


class Said:
    def __init__(self):
        self.lines = {}

    def __call__(self, key, message):
        self.lines.setdefault(key, message)


def _refused(cfg) -> str:
    with pytest.raises(ResumeRefused) as e:
        check_before_load(cfg, Said())
    text = str(e.value)
    assert "\n" not in text and text.startswith("mimo_accel: cannot resume from ")
    return text


def test_the_same_model_on_other_dp_tp_and_pp_sizes_resumes(tmp_path):
    root = _saved(tmp_path, _config(*REFERENCE))
    said = Said()
    resumed = check_before_load(_config(*OTHER, load=root), said)
    assert resumed.iteration == 3 and resumed.directory == root / "iter_0000003"
    assert resumed.saved.parallelism == {"vision": (1, 1, 1), "language": (2, 2, 2)}
    assert resumed.now.parallelism == {"vision": (1, 1, 2), "language": (1, 2, 1)}
    assert resumed.tp_changed() == {"language": (2, 1)}
    assert "resuming" in said.lines["resume:layout"] and "resume:global-batch" not in said.lines
    assert check_before_load(_config(*OTHER), Said()) is None  # nothing to resume from


def test_rng_states_kept_per_tp_and_pp_rank_stop_a_resume_that_would_load_them(tmp_path):
    root = _saved(tmp_path, _config(*REFERENCE))
    now = _config(*OTHER, load=root)
    now.checkpoint.load_rng = True
    text = _refused(now)
    assert "each rank's RNG state (checkpoint.save_rng=True)" in text and "set checkpoint.load_rng=False" in text
    dp_only = _config("--vision-dp", "2", "--language-dp", "4", "--language-tp", "2", "--language-pp", "2",
                      "--mbs", "4", load=root)
    dp_only.checkpoint.load_rng = True
    assert check_before_load(dp_only, Said()) is not None  # the same TP/PP ranks: their states load


def test_the_iteration_bridge_loads_is_the_one_checked(tmp_path):
    root = _saved(tmp_path, _config(*REFERENCE))
    _saved(tmp_path, _config(*REFERENCE, "--hidden", "48"), iteration=5)
    assert iteration_directory(_config(load=root).checkpoint) == (root / "iter_0000005", 5)
    cfg = _config(*OTHER, load=root)
    assert "another model" in _refused(cfg)  # the tracker names 5, of hidden 48
    cfg.checkpoint.ckpt_step = 3
    assert check_before_load(cfg, Said()).iteration == 3
    assert check_before_load(_config(*OTHER, load=root / "iter_0000003"), Said()).iteration is None


def test_a_checkpoint_of_another_model_stops_before_the_load(tmp_path):
    root = _saved(tmp_path, _config(*REFERENCE))
    text = _refused(_config(*OTHER, "--hidden", "48", load=root))
    assert "another model: the language model hidden_size 32 there, 48 here" in text
    assert "checkpoint.pretrained_checkpoint" in text


def test_a_checkpoint_in_a_format_the_new_layout_cannot_load_stops_before_the_load(tmp_path):
    legacy = _config(*REFERENCE)
    legacy.checkpoint.ckpt_format = "torch"
    root = _saved(tmp_path, legacy)
    now = _config(*OTHER, load=root)
    now.checkpoint.ckpt_format = "torch"
    text = _refused(now)
    assert "saved as 'torch' (one file per TP/PP rank)" in text and "language tp2 pp2 -> tp1 pp2" in text
    assert "'torch_dist'" in text
    same_layout = _config(*REFERENCE, load=root)
    same_layout.checkpoint.ckpt_format = "torch"
    assert check_before_load(same_layout, Said()) is not None
    assert "saved as 'torch' and this run loads 'torch_dist'" in _refused(_config(*REFERENCE, load=root))


@pytest.mark.parametrize("fully_reshardable", [False, True])
def test_the_distributed_optimizers_sharding_decides_a_tp_or_pp_change(tmp_path, fully_reshardable):
    saved = _config(*REFERENCE)
    saved.optimizer.use_distributed_optimizer = True
    saved.checkpoint.dist_ckpt_optim_fully_reshardable = fully_reshardable
    root = _saved(tmp_path, saved)
    now = _config(*OTHER, load=root)
    now.optimizer.use_distributed_optimizer = True
    if fully_reshardable:
        assert check_before_load(now, Said()).saved.optimizer_sharding == "fully_reshardable"
        return
    text = _refused(now)
    assert "'dp_reshardable'" in text and "dist_ckpt_optim_fully_reshardable=True" in text
    now.checkpoint.load_optim = False
    assert check_before_load(now, Said()) is not None
    dp_only = _config("--vision-dp", "2", "--language-dp", "4", "--language-tp", "2", "--language-pp", "2",
                      "--mbs", "4", load=root)
    dp_only.optimizer.use_distributed_optimizer = True
    assert check_before_load(dp_only, Said()) is not None


def test_a_global_batch_of_another_size_is_said_and_stops_a_step_window_off_its_steps(tmp_path):
    root = _saved(tmp_path, _config(*REFERENCE))
    said = Said()
    resumed = check_before_load(_bigger(root), said)
    assert "global batches of 8 and this layout 12" in said.lines["resume:global-batch"]
    # 1 step of 8 = 4 micro-batches of 2: not the start of a 6-micro-batch step of 12 (3 steps are)
    with pytest.raises(ResumeRefused, match="global batches of 8 and this run 12, so consumed_samples=8"):
        check_order(resumed, samples=1000, consumed=8, window=6, canonical=False)
    check_order(resumed, samples=1000, consumed=24, window=6, canonical=False)
    check_order(resumed, samples=1000, consumed=8, window=1, canonical=False)  # upstream's order goes on


def _bigger(root: Path):
    cfg = _config(*OTHER, load=root)
    cfg.train.global_batch_size = 12
    return cfg


def test_a_cyclic_reader_whose_micro_batch_changes_its_permutation_stops_at_the_loader(tmp_path):
    root = _saved(tmp_path, _config(*REFERENCE, "--dataloader-type", "cyclic"))
    resumed = check_before_load(_config(*OTHER, "--dataloader-type", "cyclic", "--mbs", "4", load=root), Said())
    check_order(resumed, samples=64, consumed=24, window=1, canonical=False)  # 64 % 2 == 64 % 4
    with pytest.raises(ResumeRefused, match=r"66 % 2 = 0 in the checkpoint's run, 66 % 4 = 2 here"):
        check_order(resumed, samples=66, consumed=24, window=1, canonical=False)
    check_order(resumed, samples=66, consumed=0, window=1, canonical=False)  # a fresh start reads from 0
