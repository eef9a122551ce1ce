"""The offline reader: every ``rank<N>.jsonl`` of a profile directory, and what was wrong with them."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.recorder import FORMAT, FORMAT_V1, UNNAMED_REGIONS, module_regions
from mimo_accel.profiler.run_files import NO_RUN, by_clock, by_run, files
from mimo_accel.profiler.step_line import module_seconds

_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


class ProfileError(Exception):
    """A profile directory or record that cannot be used."""


class NoProfileData(ProfileError):
    """A directory holds no readable profile data at all."""


class MixedRuns(ProfileError):
    """A directory holds the rank files of more than one run."""


class UnknownRun(ProfileError):
    """A run asked for by id that a directory's rank files do not name (or not alone)."""


#: Said once for a directory of several rank files none of which names its run.
NO_RUN_ID = ("the rank files carry no run id (written before mimo_accel recorded one): that they all "
             "belong to one run cannot be checked")


@dataclass
class RankLog:
    """One rank's file: its header (``None`` if missing) and its step records, in file order."""

    rank: int
    path: Path
    header: dict[str, Any] | None
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def module(self) -> str:
        return str((self.header or {}).get("module", "unknown"))

    @property
    def dp_rank(self) -> int:
        return int((self.header or {}).get("dp_rank", 0))

    @property
    def dp_size(self) -> int:
        return int((self.header or {}).get("dp_size", 1))

    @property
    def format(self) -> str | None:
        return (self.header or {}).get("format")

    @property
    def regions(self) -> tuple[str, ...]:
        """The regions this rank's file names: declared in its header or timed in a step (its
        ``timed_calls``)."""
        found: dict[str, None] = {}
        for r in (self.header or {}).get("regions") or ():
            if isinstance(r, str):
                found[r] = None
        for rec in self.steps:
            calls = rec.get("timed_calls")
            if isinstance(calls, dict):
                found.update(dict.fromkeys(k for k in calls if isinstance(k, str)))
        return tuple(found)

    @property
    def module_regions(self) -> tuple[str, str]:
        """The regions this rank's module's forward and backward are timed under:
        ``(<module>_fwd, <module>_bwd)``. A file without them whose rank timed ``vision_fwd`` /
        ``vision_bwd`` (a module the recorder could not name is timed as "vision"): those."""
        own = module_regions(self.module)
        have = self.regions
        if own[0] in have or own[1] in have or self.module == LANGUAGE:
            return own
        if UNNAMED_REGIONS[0] in have or UNNAMED_REGIONS[1] in have:
            if any(module_seconds(rec, UNNAMED_REGIONS) is not None for rec in self.steps):
                return UNNAMED_REGIONS  # type: ignore[return-value]
        return own


@dataclass
class Run:
    """All rank files of one profile directory, and what was wrong with them."""

    directory: Path
    ranks: dict[int, RankLog]
    warnings: list[str]
    world_size: int | None
    run_id: str | None = None  # what every rank's header names (None: older files)

    @property
    def header(self) -> dict[str, Any]:
        """The lowest rank's header (run-wide fields: layout, label, config, versions)."""
        for r in sorted(self.ranks):
            if self.ranks[r].header:
                return self.ranks[r].header  # type: ignore[return-value]
        return {}

    @property
    def label(self) -> str:
        return str(self.header.get("label", "")) or self.directory.name

    @property
    def layout(self) -> dict[str, Any]:
        return dict(self.header.get("layout", {}))


def _holds_rank_files(path: Path) -> bool:
    try:
        return path.is_dir() and any(_RANK_FILE.match(q.name) for q in path.iterdir())
    except OSError:
        return False


def read_run(directory: str | os.PathLike[str], *, run: str | None = None) -> Run:
    """Load every ``rank<N>.jsonl`` of ``directory`` (with ``run``, those of that run: its id, or
    the start of it that names one run alone).

    Tolerates and reports (in ``Run.warnings``): a torn last line, invalid lines, empty files,
    missing headers, restarted files (several headers), ranks missing from ``world_size``, and
    headers that disagree. Raises :class:`MixedRuns` where the files belong to several runs
    (:mod:`~mimo_accel.profiler.run_files`), naming each run's files, :class:`ProfileError` where
    ``run`` names none, and :class:`NoProfileData` if the directory does not exist or no file has
    a single step record.
    """
    d = Path(directory)
    expected = ("rank<N>.jsonl files written by mimo_accel.profiler.Recorder; give the DIR of a job run with "
                "profile=DIR, MIMO_ACCEL_PROFILE=DIR")
    if not d.exists():
        raise NoProfileData(f"{d}: no such directory (expected a profile directory with {expected})")
    if not d.is_dir():
        raise NoProfileData(f"{d}: not a directory (expected a profile directory with {expected})")
    files = sorted(
        ((int(m.group(1)), p) for p in d.iterdir() if (m := _RANK_FILE.match(p.name)) and p.is_file()),
    )
    if not files:
        runs = sorted(p.name for p in d.iterdir() if _holds_rank_files(p))
        if runs:  # a parent of runs (e.g. a rehearsal's --out): name them
            shown = ", ".join(str(d / r) for r in runs[:3]) + (", ..." if len(runs) > 3 else "")
            raise NoProfileData(f"{d}: no rank<N>.jsonl files here, but its subdirectories hold runs: give one of "
                                f"them ({shown})")
        raise NoProfileData(f"{d}: no rank<N>.jsonl files (expected {expected})")

    warnings: list[str] = []
    ranks: dict[int, RankLog] = {}
    for rank, path in files:
        log = _read_rank_file(rank, path, warnings)
        if log is not None:
            ranks[rank] = log
    ranks, run_id = _one_run(d, ranks, run, warnings)

    if not any(log.steps for log in ranks.values()):
        detail = "; ".join(warnings) if warnings else "the files hold headers but no step records"
        raise NoProfileData(f"{d}: no step records in {len(files)} rank file(s) ({detail})")

    # world size and missing ranks
    sizes = {int(log.header["world_size"]) for log in ranks.values() if log.header and "world_size" in log.header}
    world_size = max(sizes) if sizes else None
    if len(sizes) > 1:
        warnings.append(f"headers disagree on world_size ({sorted(sizes)}); using {world_size}")
    if world_size is not None:
        present = {r for r in ranks if ranks[r].steps}
        beyond = sorted(r for r in ranks if r >= world_size)
        if beyond:
            warnings.append(f"rank file(s) {beyond} beyond world_size {world_size}")
        missing = [r for r in range(world_size) if r not in present]
        if missing:
            warnings.append(
                f"{_ranks_str(missing)} of world {world_size} missing or without steps "
                f"({len(present)} of {world_size} ranks have data)"
            )
    labels = {str(log.header.get("label", "")) for log in ranks.values() if log.header}
    if len(labels) > 1:
        warnings.append(f"ranks carry different labels: {sorted(labels)}")
    layouts = {json.dumps(log.header.get("layout", {}), sort_keys=True) for log in ranks.values() if log.header}
    if len(layouts) > 1:
        warnings.append("ranks carry different layouts in their headers; using the lowest rank's")
    return Run(directory=d, ranks=ranks, warnings=warnings, world_size=world_size, run_id=run_id)


def _one_run(d: Path, ranks: dict[int, RankLog], run: str | None,
             warnings: list[str]) -> tuple[dict[int, RankLog], str | None]:
    """The rank files of one run, and its id: all of them, refused where they name several runs
    (or, without run ids, their clocks say so); with ``run``, that run's."""
    groups = by_run({r: log.header for r, log in ranks.items() if log.header is not None})
    named = ", ".join(f"{'files without a run id' if g == NO_RUN else 'run ' + g} ({files(rs)})"
                      for g, rs in groups.items())
    if run is not None:
        ids = [g for g in groups if g != NO_RUN]
        chosen = [g for g in ids if g == run] or [g for g in ids if g.startswith(run)]
        if not ids:
            raise UnknownRun(f"{d}: --run {run}: its rank files carry no run id (written before mimo_accel "
                               "recorded one); move the files of other runs out of the directory instead")
        if len(chosen) != 1:
            why = "names several runs" if chosen else "names no run"
            raise UnknownRun(f"{d}: --run {run} {why} here; its runs: {named}")
        keep = groups[chosen[0]]
        if len(keep) < len(ranks):
            warnings.append(f"run {chosen[0]} only: left out {files(sorted(set(ranks) - set(keep)))}")
        return {r: ranks[r] for r in keep}, chosen[0]
    if len(groups) > 1:
        raise MixedRuns(f"{d} holds the rank files of {len(groups)} runs: {named}; report one with --run ID "
                        "(report, calibrate), or move the other run's files out of the directory")
    if groups:
        return ranks, next(iter(groups))
    if len(ranks) > 1:
        clocks = by_clock({r: log.steps for r, log in ranks.items()})
        if len(clocks) > 1:
            (first, t0), rest = clocks[0], clocks[1:]
            later = "; ".join(f"{files(g)} {t - t0:.0f} s later" for g, t in rest)
            raise MixedRuns(f"{d}: its rank files cannot be one run's: the same steps ended on {files(first)}, "
                            f"and on {later}; they carry no run id (written before mimo_accel recorded one), so "
                            "move the other run's files out of the directory")
        warnings.append(NO_RUN_ID)
    return ranks, None


def _ranks_str(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 8:
        return f"ranks {', '.join(map(str, ranks[:8]))}, … ({len(ranks)} ranks)"
    return f"ranks {', '.join(map(str, ranks))}"


def _read_rank_file(rank: int, path: Path, warnings: list[str]) -> RankLog | None:
    try:
        data = path.read_bytes()
    except OSError as e:
        warnings.append(f"rank {rank}: cannot read {path.name}: {e}")
        return None
    if not data.strip():
        warnings.append(f"rank {rank}: {path.name} is empty (did the rank die before its first step?)")
        return None
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    torn_tail = not text.endswith("\n")
    if not torn_tail:
        lines.pop()  # the empty string after the final newline
    log = RankLog(rank=rank, path=path, header=None)
    headers = 0
    bad: list[int] = []
    by_step: dict[int, int] = {}
    duplicates = 0
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == len(lines) and torn_tail:
                warnings.append(
                    f"rank {rank}: last line of {path.name} is incomplete (run killed mid-write?); ignored it"
                )
            else:
                bad.append(i)
            continue
        kind = rec.get("kind")
        if kind == "header":
            headers += 1
            fmt = rec.get("format")
            if fmt == FORMAT_V1:
                raise ProfileError(f"{path}: profile format {fmt!r} is no longer read; rerun the job with --profile "
                                   f"to record format {FORMAT!r}")
            if fmt != FORMAT:
                warnings.append(f"rank {rank}: {path.name} has format {fmt!r}, expected {FORMAT!r}; reading it anyway")
            if log.header is None:
                log.header = rec
                if int(rec.get("rank", rank)) != rank:
                    warnings.append(f"rank {rank}: {path.name} header says rank {rec.get('rank')}")
        elif kind == "step":
            if not _valid_step(rec):
                bad.append(i)
                continue
            step = int(rec["step"])
            if step in by_step:
                duplicates += 1
                log.steps[by_step[step]] = rec  # a restart re-ran this step: keep the latest
            else:
                by_step[step] = len(log.steps)
                log.steps.append(rec)
        else:
            bad.append(i)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" …" if len(bad) > 5 else "")
        warnings.append(f"rank {rank}: {len(bad)} unreadable line(s) in {path.name} (line {shown}); skipped")
    if log.header is None:
        warnings.append(f"rank {rank}: {path.name} has no header line; module and DP rank unknown")
    if headers > 1:
        warnings.append(
            f"rank {rank}: {path.name} holds {headers} headers (restarted into the same file?); "
            f"{duplicates} repeated step(s) keep their latest record"
        )
    if not log.steps and log.header is not None:
        warnings.append(f"rank {rank}: {path.name} has a header but no step records")
    log.steps.sort(key=lambda r: r["step"])
    return log


def _valid_step(rec: dict[str, Any]) -> bool:
    try:
        int(rec["step"])
        st = float(rec["step_time_s"])
    except (KeyError, TypeError, ValueError):
        return False
    return math.isfinite(st) and st >= 0
