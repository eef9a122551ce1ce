"""Upstream's own MegatronMIMO unit tests as a peer suite: same outcomes with and without mimo_accel.

    python upstream/upstream_peer/run.py --upstream DIR          # DIR: Megatron-Bridge checkout/extract
    python upstream/upstream_peer/run.py --from-git GITDIR --ref r0.6.0   # extract into a temp dir

Runs ``tests/unit_tests/data/megatron_mimo`` and ``tests/unit_tests/training/megatron_mimo`` of
DIR (with DIR's ``tests/unit_tests/conftest.py``) with this interpreter (the project venv), once
per mode, each in its own pytest process and scratch working directory:

    a  without mimo_accel (baseline)
    b  ``import mimo_accel; mimo_accel.enable()`` -- no feature
    c  ``mimo_accel.enable(sharded_reads=True, reorder=True, packing=True)``

In every mode, the baseline included, the plugin (peer_plugin.py, next to this file) first calls
``mimo_accel_dev.rehearse.cpu.prepare_imports()``: without its typing.override back-port and its
transformer_engine / nvidia_resiliency_ext stand-ins, megatron.bridge does not import on a CPU
machine. Prints a per-test table, a summary per mode, the tests whose outcome differs between
modes (with the last lines of the failure), and the baseline's own failures, classified.

Exit status: 0 when every mode gives the same outcome for every test, 1 when some differ,
2 when a mode could not run at all. Nothing of upstream's code is kept in this repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEST_DIRS = ("tests/unit_tests/data/megatron_mimo", "tests/unit_tests/training/megatron_mimo")
# What the tests import besides themselves: package markers and the shared conftest.
SUPPORT = ("tests/__init__.py", "tests/unit_tests/__init__.py", "tests/unit_tests/conftest.py",
           "tests/unit_tests/training/__init__.py", "pyproject.toml")
# Upstream sources of the MIMO path, extracted only to compare them with the installed package.
SOURCES = ("src/megatron/bridge/package_info.py", "src/megatron/bridge/data/megatron_mimo",
           "src/megatron/bridge/models/megatron_mimo", "src/megatron/bridge/training")
MODES = {
    "a": "no mimo_accel",
    "b": "mimo_accel.enable()",
    "c": "enable(sharded_reads, reorder, packing)",
}
PREFIX = "tests/unit_tests/"

# Baseline failures, by what the failure text says (first match wins).
CLASSES = (
    ("needs CUDA", re.compile(r"Torch not compiled with CUDA|CUDA driver|No CUDA GPUs|cuda\(\)|"
                              r"nccl|NCCL", re.I)),
    ("needs a file from the hub / network", re.compile(
        r"huggingface|hf_hub|LocalEntryNotFound|OfflineMode|ConnectionError|HTTPError|"
        r"Max retries exceeded|Temporary failure in name resolution", re.I)),
    ("needs a package missing here (CPU stand-in / not installed)", re.compile(
        r"ModuleNotFoundError|stand-in module|is not installed", re.I)),
    ("API drift (test vs installed package)", re.compile(
        r"AttributeError|ImportError|cannot import name|unexpected keyword argument|"
        r"missing \d+ required positional|got an unexpected|has no attribute", re.I)),
)


# ----------------------------------------------------------------------------------------------
# Upstream tree
# ----------------------------------------------------------------------------------------------


def extract(git_dir: str, ref: str, out: Path) -> str:
    """``git archive`` the test folders, their support files and the MIMO sources into ``out``."""
    git = ["git", f"--git-dir={git_dir}"]
    commit = subprocess.run(git + ["rev-parse", f"{ref}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    listed = subprocess.run(git + ["ls-tree", "-r", "--name-only", commit, "--", *TEST_DIRS,
                                   *SUPPORT, *SOURCES], check=True, capture_output=True,
                            text=True).stdout.split()
    archive = subprocess.run(git + ["archive", "--format=tar", commit, "--", *listed],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return commit


def describe_upstream(root: Path) -> list[str]:
    lines = [f"upstream tree: {root}"]
    if (root / ".git").exists():
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        lines.append(f"upstream HEAD: {head or '?'}")
    info = root / "src/megatron/bridge/package_info.py"
    if info.exists():
        ns: dict = {}
        text = "\n".join(ln for ln in info.read_text().splitlines()
                         if re.match(r"(MAJOR|MINOR|PATCH|PRE_RELEASE)\s*=", ln))
        exec(text, ns)  # noqa: S102 - four literal assignments
        lines.append(f"upstream tree's version: {ns['MAJOR']}.{ns['MINOR']}.{ns['PATCH']}{ns['PRE_RELEASE']}")
    return lines


def installed_versions(python: str) -> str:
    code = ("from importlib import metadata as m; print(', '.join(p + ' ' + m.version(p) for p in "
            "('megatron-bridge', 'megatron-core', 'torch')))")
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip()


def source_drift(root: Path, python: str) -> list[str]:
    """MIMO source files of the upstream tree that differ from the installed package."""
    src = root / "src/megatron/bridge"
    if not src.is_dir():
        return []
    installed = subprocess.run([python, "-c", "import importlib.util as u; "
                                "print(u.find_spec('megatron.bridge').submodule_search_locations[0])"],
                               capture_output=True, text=True).stdout.strip()
    if not installed:
        return ["(could not locate the installed megatron.bridge)"]
    differ = []
    for rel in ("data/megatron_mimo", "models/megatron_mimo", "training"):
        for f in sorted((src / rel).rglob("*.py")) if (src / rel).is_dir() else []:
            if rel == "training" and "megatron_mimo" not in f.name:
                continue
            other = Path(installed) / f.relative_to(src)
            if not other.exists() or other.read_bytes() != f.read_bytes():
                differ.append(str(f.relative_to(src)))
    return differ


# ----------------------------------------------------------------------------------------------
# Running a mode
# ----------------------------------------------------------------------------------------------


def run_mode(mode: str, root: Path, python: str, work: Path, extra: list[str], timeout: int) -> dict:
    scratch = work / f"mode_{mode}"
    scratch.mkdir()
    report = work / f"mode_{mode}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMO_ACCEL")}
    env.update(UPSTREAM_PEER_MODE=mode, UPSTREAM_PEER_REPORT=str(report),
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [python, "-m", "pytest", "-p", "peer_plugin", "-p", "no:cacheprovider",
           "-o", "addopts=", f"--rootdir={root}", "-q", "-W", "ignore", "--continue-on-collection-errors", *extra,
           *(str(root / d) for d in TEST_DIRS)]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, rc = f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {timeout}s)", None
    (work / f"mode_{mode}.log").write_text(out)
    result = {"rc": rc, "seconds": round(time.monotonic() - t0, 1), "log": str(work / f"mode_{mode}.log")}
    if report.exists():
        result.update(json.loads(report.read_text()))
    else:
        result["tests"] = None
        result["tail"] = "\n".join(out.splitlines()[-25:])
    return result


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def short(nodeid: str) -> str:
    return nodeid[len(PREFIX):] if nodeid.startswith(PREFIX) else nodeid


def classify(detail: str) -> str:
    for name, pattern in CLASSES:
        if pattern.search(detail):
            return name
    return "other (read the failure)"


def crash_line(detail: str) -> str:
    errors = [ln.strip() for ln in detail.splitlines() if ln.lstrip().startswith("E ")]
    return errors[-1][1:].strip() if errors else (detail.splitlines() or [""])[-1].strip()


def _compact(where: str) -> str:
    """Frames with the site-packages prefix cut and immediate repeats (recursion) folded."""
    frames = [re.sub(r"^.*/site-packages/", "", f) for f in where[len("where: "):].split(" -> ")]
    folded = [f for i, f in enumerate(frames) if i == 0 or f != frames[i - 1]]
    return "where: " + " -> ".join(folded)


def indent(text: str, pad: str = "      ") -> str:
    return "\n".join(pad + ln for ln in text.splitlines())


def print_report(results: dict, modes: list[str], only_diff: bool) -> tuple[list[str], list[str]]:
    ids = sorted({t for r in results.values() if r.get("tests") for t in r["tests"]})
    outcome = {m: {t: (results[m]["tests"] or {}).get(t, {}).get("outcome") or "-" for t in ids} for m in modes}
    differ = [t for t in ids if len({outcome[m][t] for m in modes}) > 1]

    width = max([len(short(t)) for t in ids] + [10])
    print()
    print(f"{'test (under ' + PREFIX + ')':<{width}}  " + "  ".join(f"{m:<8}" for m in modes))
    print("-" * (width + 10 * len(modes)))
    for t in ids:
        if only_diff and t not in differ:
            continue
        mark = "  <- differs" if t in differ else ""
        print(f"{short(t):<{width}}  " + "  ".join(f"{outcome[m][t]:<8}" for m in modes) + mark)

    print("\nSummary")
    for m in modes:
        r = results[m]
        if r.get("tests") is None:
            print(f"  ({m}) {MODES[m]:<40} DID NOT RUN (rc={r['rc']}); last lines:\n{indent(r['tail'])}")
            continue
        counts: dict[str, int] = {}
        for rec in r["tests"].values():
            counts[rec["outcome"] or "-"] = counts.get(rec["outcome"] or "-", 0) + 1
        parts = [f"{counts.pop(k, 0)} {k}" for k in ("passed", "failed", "error", "skipped")]
        parts += [f"{v} {k}" for k, v in sorted(counts.items())]
        extra = ""
        if r.get("setup", {}).get("status"):
            st = r["setup"]["status"]
            extra = f"  [active: {','.join(st.get('active', [])) or 'none'}; notes: {len(st.get('notes', []))}]"
        print(f"  ({m}) {MODES[m]:<40} {', '.join(parts)}  ({r['seconds']}s){extra}")

    print(f"\nTests whose outcome differs between modes: {len(differ)}")
    for t in differ:
        print(f"  {short(t)}: " + ", ".join(f"{m}={outcome[m][t]}" for m in modes))
        for m in modes:
            rec = (results[m]["tests"] or {}).get(t)
            if rec and rec["outcome"] not in ("passed", None) and rec.get("detail"):
                print(f"    [{m}] {rec['outcome']}:")
                print(indent("\n".join(_compact(ln) if ln.startswith("where: ") else ln
                                       for ln in rec["detail"].splitlines())))

    base = modes[0]
    failing = {t: results[base]["tests"][t] for t in ids
               if results[base].get("tests") and outcome[base][t] in ("failed", "error")}
    if failing:
        print(f"\nFailing in mode ({base}) too -- version drift / CPU-only failures, not mimo_accel: {len(failing)}")
        groups: dict[str, list[str]] = {}
        for t, rec in failing.items():
            groups.setdefault(classify(rec.get("detail", "")), []).append(t)
        for cls, tests in groups.items():
            print(f"  {cls}: {len(tests)}")
            for t in tests:
                detail = failing[t].get("detail", "")
                where = next((ln for ln in detail.splitlines() if ln.startswith("where: ")), "")
                print(f"    {short(t)}\n      {crash_line(detail)}")
                if where:
                    print(f"      {_compact(where)}")
    return ids, differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--upstream", help="a Megatron-Bridge checkout or extract (holds tests/unit_tests/...)")
    src.add_argument("--from-git", metavar="GITDIR", help="a Megatron-Bridge git dir to extract from")
    ap.add_argument("--ref", default="r0.6.0", help="ref to extract with --from-git (default r0.6.0)")
    ap.add_argument("--modes", default="a,b,c", help="comma-separated subset of a,b,c (default all)")
    ap.add_argument("--python", default=sys.executable, help="interpreter to test with (the project venv)")
    ap.add_argument("--only-diff", action="store_true", help="table rows only for differing tests")
    ap.add_argument("--json", help="write every mode's per-test records here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch dir (logs, per-mode JSON)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per mode (default 1800)")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments, after --")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes takes a comma-separated subset of {','.join(MODES)}")

    work = Path(tempfile.mkdtemp(prefix="upstream_peer_"))
    try:
        if args.from_git:
            root = work / "upstream"
            root.mkdir()
            commit = extract(args.from_git, args.ref, root)
            print(f"extracted {args.ref} = {commit} from {args.from_git} into {root}")
        else:
            root = Path(args.upstream).resolve()
        missing = [d for d in TEST_DIRS + ("tests/unit_tests/conftest.py",) if not (root / d).exists()]
        if missing:
            print(f"error: {root} lacks {', '.join(missing)}: pass a Megatron-Bridge checkout", file=sys.stderr)
            return 2

        for line in describe_upstream(root):
            print(line)
        print(f"installed: {installed_versions(args.python)}  ({args.python})")
        drift = source_drift(root, args.python)
        if (root / "src/megatron/bridge").is_dir():
            print("MIMO sources vs installed: " + (f"{len(drift)} file(s) differ: {', '.join(drift)}"
                                                  if drift else "identical"))
        print("note: every mode, the baseline (a) included, calls mimo_accel_dev.rehearse.cpu.prepare_imports() before "
              "any test is imported\n      (typing.override back-port + transformer_engine / "
              "nvidia_resiliency_ext stand-ins):\n      without it megatron.bridge does not import on this "
              "CPU machine.")

        results = {}
        for m in modes:
            print(f"running mode ({m}) {MODES[m]} ...", flush=True)
            results[m] = run_mode(m, root, args.python, work, args.pytest_args, args.timeout)
        ids, differ = print_report(results, modes, args.only_diff)
        if args.json:
            Path(args.json).write_text(json.dumps({"upstream": str(root), "modes": MODES,
                                                   "results": results, "differ": differ}, indent=1))
        if args.keep:
            print(f"\nscratch (logs, per-mode JSON): {work}")
        if any(results[m].get("tests") is None for m in modes):
            return 2
        return 1 if differ else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
