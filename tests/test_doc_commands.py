"""The docs' examples run as written (tests/_doc_commands.py reads them out of README.md,
docs/usage.md and docs/cluster.md): every shell command and Python block is run here, run by the
distributed test named in RUN_ELSEWHERE, or matches a line of NOT_HERE saying why no CPU machine
can run it (or its page marks the block so). A new example none of these covers fails
``test_every_example_is_run_or_says_why_not``: run it, or say why not.

Each runs in a directory of its own, holding what the examples before it on the page leave there
(the docs' own ``# run.yaml``) and the runs they name, from tests/data/profiles:

- ``runs/before``, ``runs/now``, ``runs/baseline``: ``profile/``, ``runs/reads``: ``reads/``,
  ``runs/reorder``: ``reorder/``, and ``runs/after``, ``runs/packing``: ``all/``, the profiles of four
  runs of examples/train_mimo.py on 3 CPU ranks (images dp1 -> language dp2, Bridge's
  MegatronMIMODataset over image files, 8 iterations), the profiler alone, then sharded reads,
  reorder and packing added one at a time::

      NO_VCS_VERSION=1 MIMO_ACCEL=profile MIMO_ACCEL_PROFILE=tests/data/profiles/profile mimo-accel run -- \\
          .venv/bin/torchrun --nproc-per-node 3 examples/train_mimo.py --cpu --vision-dp 1 --language-dp 2 \\
          --dataset images --train-iters 8

  (``reads/`` with MIMO_ACCEL=profile,sharded_reads, ``reorder/`` with
  MIMO_ACCEL=profile,sharded_reads,reorder, ``all/`` with MIMO_ACCEL=all; NO_VCS_VERSION keeps
  Bridge's version free of the checkout's commit).
- ``runs/cache/costs.npz`` and ``costs-train.npz`` (``run.yaml``'s ``cost_index``):
  tests/data/profiles/costs.npz, the cost index the second run derived of that dataset.

A command passes when it exits 0, prints no ``error:`` and no traceback, and writes the files its
options name (``--json``, ``--html``, ``--png``, ``--out``, ``> FILE``; JSON parses); an
``eval "$(mimo-accel env ...)"`` must leave the variables set; a Python block must leave mimo_accel
enabled with what it asked for.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _early
from tests._doc_commands import ROOT, Example, all_examples

DATA = ROOT / "tests" / "data" / "profiles"
BIN = Path(sys.executable).parent

# Commands no CPU machine can run, each with why (a pattern searched in the command).
NOT_HERE = (
    (r"torchrun --nproc-per-node 8\b", "a job of 8 GPU ranks (NCCL)"),
    (r"(?<![\w/])train\.py\b", "train.py stands for the user's own training script"),
    (r"torchrun \.\.\. ", "upstream's launcher on the user's GPUs, its arguments elided (the '...'); "
                           "tests/test_resume_switch.py resumes on another layout on Bridge's loop"),
    (r"^s(run|batch)\b", "a Slurm launcher: there is no cluster here (docs/cluster.md)"),
    (r"(?m)^\s*standard_provider\.", "lines to paste into upstream's launcher (its _build_mimo_provider), "
                                       "not a script of their own"),
    (r"^pip install\b", "installs into the job's environment: make setup installs it here, and "
                          "tests/test_install.py installs the wheel in a fresh virtualenv"),
    (r"^tensorboard\b", "TensorBoard's web server runs until stopped; tests/test_tensorboard.py reads the "
                        "event files back"),
)
# Commands that start ranks: run by a distributed test, named here.
RUN_ELSEWHERE = (
    (r"examples/train_mimo\.py .*--cpu", "test_the_cpu_example_runs_as_written (below)"),
    (r"examples/nemo_run_launch\.py", "tests/test_nemo_run.py"),
)
OUTPUT_FLAGS = ("--json", "--html", "--png", "--out", "--points")


def _reason(example: Example, table) -> str | None:
    return next((why for pattern, why in table if re.search(pattern, example.text)), None)


def where(example: Example) -> tuple[str, str]:
    """("here" | "elsewhere" | "not here", why)."""
    if example.not_here:
        return "not here", example.not_here
    if example.kind == "file":
        return "here", "written into each example's directory"
    if why := _reason(example, NOT_HERE):
        return "not here", why
    if why := _reason(example, RUN_ELSEWHERE):
        return "elsewhere", why
    return "here", ""


EXAMPLES = all_examples()
RUN_HERE = [e for e in EXAMPLES if where(e)[0] == "here" and e.kind != "file"]
FILES = {e.name: e.text for e in EXAMPLES if e.kind == "file"}


def _workdir(key: str) -> Path:
    """A directory with what the examples presuppose (the module docstring)."""
    d = _early.scratch(f"doc-{key}")
    for name, src in (("before", "profile"), ("now", "profile"), ("after", "all"), ("baseline", "profile"),
                      ("reads", "reads"), ("reorder", "reorder"), ("packing", "all")):
        shutil.copytree(DATA / src, d / "runs" / name)
    (d / "runs" / "cache").mkdir()
    for target in (d / "runs" / "cache" / "costs.npz", d / "costs-train.npz"):
        shutil.copyfile(DATA / "costs.npz", target)
    for name, text in FILES.items():
        (d / name).write_text(text)
    return d


def _env(d: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "MIMO_ACCEL_CACHE_DIR": str(d / "cache")}


def _python(block: str) -> str:
    # the page's blocks run in one script: `import mimo_accel` comes from the first
    return ("import json\nimport mimo_accel\n" + block +
            "\nprint('ACTIVE ' + json.dumps(mimo_accel.status()['active']))\n")


def _key(example: Example) -> str:
    return f"doc-{EXAMPLES.index(example)}"


def _declare() -> None:
    for e in RUN_HERE:
        d = _workdir(_key(e))
        if e.kind == "python":
            argv = [sys.executable, "-c", _python(e.text)]
        else:  # the variables the command leaves, for an `eval` of `mimo-accel env`
            argv = ["bash", "-c", f"set -eo pipefail\n{e.text}\nenv > {shlex.quote(str(d / 'env.after'))}"]
        _early.command(_key(e), argv, module=__name__, env=_env(d), cwd=d, needs_megatron=e.kind == "python",
                       timeout_s=180.0)


_declare()


def _outputs(command: str) -> list[str]:
    words = shlex.split(command.replace("$(", "( "), comments=True)
    out = [w2 for w, w2 in zip(words, words[1:]) if w in OUTPUT_FLAGS and not w2.startswith("-")]
    return out + [w2 for w, w2 in zip(words, words[1:]) if w == ">"]


def _params(examples):
    # a Python block's enable() checks the installed Megatron pair; the CPU example trains on it
    return [pytest.param(e, id=e.id, marks=pytest.mark.megatron if e.kind == "python" or "train_mimo" in e.text else ())
            for e in examples]


@pytest.mark.parametrize("example", _params(RUN_HERE))
def test_the_example_runs_as_written(example):
    proc = _early.result(_key(example))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{example.id}: exit {proc.returncode}\n{said[-3000:]}"
    assert not re.search(r"\berror:|Traceback \(most recent call last\)", said), f"{example.id}:\n{said[-3000:]}"
    d = Path(_early._commands[_key(example)]["cwd"])
    if example.kind == "python":
        active = json.loads(re.search(r"^ACTIVE (.*)$", proc.stdout, re.M).group(1))
        asked = [f for f in ("sharded_reads", "reorder", "packing") if f"{f}=True" in example.text]
        assert active and set(asked) <= set(active), f"{example.id}: active {active}"
        return
    for name in _outputs(example.text):
        path = d / name
        assert path.is_file() and path.stat().st_size > 0, f"{example.id}: wrote no {name}"
        if name.endswith(".json"):
            json.loads(path.read_text())
    if re.match(r"eval \"\$\(mimo-accel env\b", example.text):
        after = dict(ln.split("=", 1) for ln in (d / "env.after").read_text().splitlines() if "=" in ln)
        assert after.get("MIMO_ACCEL", "0") not in ("", "0"), f"{example.id}: MIMO_ACCEL not set after the eval"


def test_every_example_is_run_or_says_why_not():
    assert len(EXAMPLES) >= 20 and len(RUN_HERE) >= 10
    for e in EXAMPLES:
        kind, why = where(e)
        assert kind == "here" or why, e.id
    # every line of the tables still names an example (no stale reason)
    for table in (NOT_HERE, RUN_ELSEWHERE):
        for pattern, why in table:
            assert any(re.search(pattern, e.text) for e in EXAMPLES), f"no example matches {pattern!r} ({why})"


def test_a_broken_example_fails(tmp_path):
    """The checks above catch what they look for: a flag the command lacks, and an output not written."""
    bad = subprocess.run([str(BIN / "mimo-accel"), "report", "--no-such-flag"], capture_output=True, text=True,
                         env=_env(tmp_path), cwd=tmp_path, timeout=60)
    assert bad.returncode != 0 and re.search(r"\berror:", bad.stderr)
    assert _outputs("mimo-accel report a b --json r.json --html r.html > out.txt") == ["r.json", "r.html", "out.txt"]
    assert _outputs("mimo-accel env --json --features all > env.json") == ["env.json"]


CPU_EXAMPLES = [e for e in EXAMPLES if re.search(RUN_ELSEWHERE[0][0], e.text)]


@pytest.mark.distributed
@pytest.mark.parametrize("example", _params(CPU_EXAMPLES))
def test_the_cpu_example_runs_as_written(example, tmp_path):
    """The docs' CPU command of examples/train_mimo.py, from the repository (its relative paths),
    with /tmp/ made this test's directory and .venv/bin/ this Python's."""
    command = example.text.replace("/tmp/", f"{tmp_path}/").replace(".venv/bin/", f"{BIN}/")
    env = _env(tmp_path)
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"{example.id}: still running after 480 s\n{out[-4000:]}")
    assert proc.returncode == 0, f"{example.id}: exit {proc.returncode}\n{out[-4000:]}"
    # every path the command names holds what it was asked for
    named = re.findall(rf"{re.escape(str(tmp_path))}/(\w+)", command)
    assert named
    for name in named:
        files = [p for p in (tmp_path / name).rglob("*") if p.is_file()]
        assert files, f"{example.id}: nothing in {tmp_path / name}\n{out[-2000:]}"
    if "profile=" in command:
        prof = tmp_path / re.search(rf"profile={re.escape(str(tmp_path))}/(\w+)", command).group(1)
        headers = [json.loads((prof / f"rank{r}.jsonl").read_text().splitlines()[0]) for r in range(3)]
        assert all(h["config"]["features"] == ["sharded_reads", "reorder", "packing", "profile"] for h in headers)
    assert "train_mimo: layout" in out and "mimo_accel features: sharded_reads, reorder, packing" in out
