"""`mimo-accel index`: build the per-sample cost index that plan-before-read reordering needs and
write it beside the dataset (the manifest format and the builder: :mod:`mimo_accel.tools.index_builder`).

``mimo-accel index MANIFEST`` indexes a JSONL manifest; ``mimo-accel index --dataset MODULE:NAME``
instead builds, offline, the index a training job derives by itself when none is configured
(:mod:`mimo_accel.datasets`), into the same cache. ``--verify`` first decodes every file
(:mod:`mimo_accel.tools.decode_check`), since indexing reads headers only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from mimo_accel.costs import ResizeRule
from mimo_accel.costs.rules import rule_text
from mimo_accel.tools.arguments import UsageError, fail, one_line, output_dir, output_file, parse, positive_int
from mimo_accel.tools.index_builder import (
    CHARS_PER_TOKEN,
    DEFAULT_MODULE,
    DEFAULT_WORKERS,
    INDEX_SUFFIX,
    build_index_from_manifest,
    default_index_path,
    manifest_chunks,
    summarize,
)

__all__ = ["load_dataset_spec", "main"]


PROG = "mimo-accel index"


def _parser() -> argparse.ArgumentParser:
    d = ResizeRule()
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Build the per-sample cost index (plan-before-read reordering). From a JSONL manifest: "
                    "one object per sample in dataset order, with \"images\" (paths relative to the "
                    "manifest) or \"image_sizes\" ([h, w] pairs), and \"tokens\" or \"text\" "
                    f"(tokens estimated as len(text)/{CHARS_PER_TOKEN}). Or from the training dataset itself "
                    "(--dataset): the same index a training job derives when no index is configured, "
                    "written to the same cache, so the job finds it. Image sizes come from file headers; "
                    "nothing is decoded.")
    p.add_argument("manifest", nargs="?", help="the JSONL manifest (or give --dataset)")
    p.add_argument("--dataset", metavar="MODULE:NAME",
                   help="the training dataset: NAME in MODULE (a module name, or a .py file) is the dataset "
                        "or a function returning it (a Bridge MegatronMIMODataset or DirectSFTDataset). "
                        "The index goes to the cache the training job reads (see --cache-dir)")
    p.add_argument("--cache-dir", help="with --dataset: the cache directory (default: $MIMO_ACCEL_CACHE_DIR, "
                                       "else ~/.cache/mimo_accel); give the training job the same one")
    p.add_argument("--refresh", action="store_true", help="with --dataset: rebuild even if the cache has it")
    p.add_argument("--split", default="train", choices=("train", "validation", "test"),
                   help="the split the index describes, recorded in the file: a training job refuses it for "
                        "another split's loader (default: train)")
    p.add_argument("--module", metavar="NAME", default=None,
                   help=f"manifest only: the encoder module the images price, as the layout names it (default "
                        f"{DEFAULT_MODULE!r}; e.g. 'images')")
    p.add_argument("--out", help=f"where to write the index (manifest default: <manifest>{INDEX_SUFFIX}; "
                                 "with --dataset: a copy besides the cache, for enable(cost_index=PATH))")
    p.add_argument("--processor", metavar="NAME_OR_PATH",
                   help="manifest only: the image processor you train with (an HF id or a local directory with its "
                        "preprocessor_config.json; needs transformers): the resize rule is read from it. A manifest "
                        "with images needs this or the rule's own options below")
    p.add_argument("--patch-size", type=positive_int, default=None,
                   help="manifest only, without --processor: vision patch size in pixels (Qwen2-VL and Qwen2.5-VL "
                        "14; Qwen3-VL and Qwen3.5-VL 16), given with --min-pixels and --max-pixels")
    p.add_argument("--merge-size", type=positive_int, default=None,
                   help=f"manifest only, without --processor: spatial merge size (default {d.merge_size})")
    p.add_argument("--temporal-patch-size", type=positive_int, default=None,
                   help=f"manifest only, without --processor: temporal patch size (default {d.temporal_patch_size})")
    p.add_argument("--min-pixels", type=positive_int, default=None,
                   help="manifest only: the processor's size.shortest_edge (or the collate's min_pixels); with "
                        "--processor it overrides the processor's, as a collate's does")
    p.add_argument("--max-pixels", type=positive_int, default=None,
                   help="manifest only: the processor's size.longest_edge (or the collate's max_pixels); with "
                        "--processor it overrides the processor's")
    p.add_argument("--workers", type=positive_int, default=None,
                   help=f"threads reading image headers (manifest default {DEFAULT_WORKERS}: serial, the fastest from a "
                        "local disk's page cache; more overlap the open latency of a network file system. With "
                        "--dataset the default is the probe's: a pool when a chunk has many files); with --verify "
                        "also the decoding threads (default there: one per CPU)")
    p.add_argument("--verify", action="store_true",
                   help="first decode every image (Pillow) and audio file (soundfile) the index is read from, in "
                        "parallel (--workers threads; default one per CPU): list those that cannot be decoded, one "
                        "line each, and exit 2 without writing anything (indexing alone reads headers only)")
    p.add_argument("--log", metavar="PATH",
                   help="with --dataset: where the output of importing and building the dataset goes (megatron "
                        "and transformers warnings; default: mimo-accel-index.log in the temp directory)")
    return p


_RULE_OPTIONS = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels")
_FROM_PROCESSOR = ("patch_size", "merge_size", "temporal_patch_size")  # never overridden: the processor's
_REQUIRED = ("patch_size", "min_pixels", "max_pixels")  # no default fits every Qwen-VL processor


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def _manifest_rule(args) -> Optional[ResizeRule]:
    """The resize rule a manifest's images are priced by: the processor's (``--processor``), or the
    one the options give whole; None when neither is given (the builder then refuses a manifest
    with images, naming its first). No default: Qwen2-VL's and Qwen3-VL's differ in patch size and
    pixel bounds, and a wrong rule prices every image wrong without a word."""
    given = {o: getattr(args, o) for o in _RULE_OPTIONS if getattr(args, o) is not None}
    if "min_pixels" in given and "max_pixels" in given and given["min_pixels"] > given["max_pixels"]:
        raise UsageError(f"--min-pixels {given['min_pixels']} exceeds --max-pixels {given['max_pixels']}; give a "
                         "smaller --min-pixels or a larger --max-pixels")
    if args.processor is not None:
        fixed = [_flag(o) for o in _FROM_PROCESSOR if o in given]
        if fixed:
            raise UsageError(f"{', '.join(fixed)}: with --processor the patch, merge and temporal sizes are the "
                             "processor's own: drop them (--min-pixels / --max-pixels may override its pixel bounds, "
                             "as a collate's do)")
        return processor_rule(args.processor, given.get("min_pixels"), given.get("max_pixels"))
    if not given:
        return None
    missing = [_flag(o) for o in _REQUIRED if o not in given]
    if missing:
        raise UsageError(f"{', '.join(_flag(o) for o in given)} without {' and '.join(missing)}: give the whole rule "
                         "of the processor you train with (patch 14 for Qwen2-VL and Qwen2.5-VL, 16 for Qwen3-VL and "
                         "Qwen3.5-VL; the pixels are its size.shortest_edge and size.longest_edge), or --processor "
                         "NAME_OR_PATH to read it")
    d = ResizeRule()
    return ResizeRule(**{o: given.get(o, getattr(d, o)) for o in _RULE_OPTIONS})


def processor_rule(name: str, min_pixels: Optional[int] = None, max_pixels: Optional[int] = None) -> ResizeRule:
    """The resize rule of the image processor ``name`` (an HF id or a local directory), read with
    transformers' ``AutoImageProcessor``; ``min_pixels``/``max_pixels`` override its bounds."""
    from mimo_accel.datasets.processors import qwen_resize_rule
    from mimo_accel.datasets.sources import DeriveError

    try:  # from its module: the package's top-level name is a stand-in that wants torchvision
        from transformers.models.auto.image_processing_auto import AutoImageProcessor
    except ImportError:
        raise UsageError("--processor needs transformers, which is not installed: pip install transformers "
                         "(megatron-bridge installs it), or give the rule: --patch-size, --min-pixels and "
                         "--max-pixels") from None
    if name.startswith(("/", ".", "~")) and not Path(name).expanduser().exists():
        raise UsageError(f"--processor {name}: no such directory; give the directory the processor was saved in "
                         "(with its preprocessor_config.json), or an HF id")
    try:
        processor = AutoImageProcessor.from_pretrained(os.path.expanduser(name))
    except Exception as exc:  # an unknown id, no network, a directory without a processor config: said as one line
        raise UsageError(f"--processor {name}: no image processor could be loaded ({type(exc).__name__}: "
                         f"{one_line(exc)}); give a directory holding its preprocessor_config.json, or an HF id "
                         "this machine can download") from None
    try:
        rule = qwen_resize_rule(processor, min_pixels=min_pixels, max_pixels=max_pixels)
    except DeriveError as exc:
        raise UsageError(f"--processor {name}: {exc}") from None
    if rule is None:
        raise UsageError(f"--processor {name}: a {type(processor).__name__} is not a Qwen-VL image processor "
                         "(patch_size, merge_size), and a manifest prices images by a Qwen-VL resize rule: index the "
                         "dataset itself instead (--dataset MODULE:NAME)")
    return rule


def _print_summary(console, summary: dict[str, Any], out: Any, seconds: float, workers: Optional[int],
                   source: Optional[str] = None, verified: Optional[int] = None) -> None:
    from rich.table import Table

    table = Table(title="mimo-accel cost index", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")  # paths are folded, never cut short
    tk = summary["tokens_per_sample"]
    if source:
        table.add_row("dataset", source)
    table.add_row("samples", f"{summary['samples']:,}")
    encoders = summary["encoders"]
    if len(encoders) == 1 and "images" in summary:
        pa = summary["patches_per_image_sample"]
        name = next(iter(encoders))
        if name != DEFAULT_MODULE:
            table.add_row("encoder module", name)
        table.add_row("images", f"{summary['images']:,} (up to {summary['max_images_per_sample']} per sample)")
        table.add_row("text-only samples", f"{summary['text_only_samples']:,} ({summary['text_only_fraction']:.1%})")
        table.add_row("patches per sample with images",
                      f"p50 {pa['p50']:,.0f} · p90 {pa['p90']:,.0f} · max {pa['max']:,.0f}")
    for name, e in encoders.items():
        if len(encoders) > 1:
            d = e["rows_per_sample_with"]
            table.add_row(f"{name}: items", f"{e['items']:,} (up to {e['max_items_per_sample']} per sample); "
                                            f"{e['samples_without']:,} samples without ({e['fraction_without']:.1%})")
            table.add_row(f"{name}: rows per sample with items",
                          f"p50 {d['p50']:,.0f} · p90 {d['p90']:,.0f} · max {d['max']:,.0f}")
        table.add_row("resize rule" if len(encoders) == 1 else f"{name}: rule",
                      rule_text(e["rule"]) if e["items"] else "none needed: no items to price")
    table.add_row("tokens per sample", f"p50 {tk['p50']:,.0f} · p90 {tk['p90']:,.0f} · max {tk['max']:,.0f}")
    threads = workers if workers is not None else "the probe's default" if source else DEFAULT_WORKERS
    table.add_row("header-read threads", str(threads))
    if verified:
        table.add_row("decoded (--verify)", f"{verified:,} files, every one decodable")
    elif verified is not None:  # said, never a silent pass
        table.add_row("decoded (--verify)", "nothing: no sample names an image or audio file (images held in "
                                            "memory or as bytes are not decoded)")
    table.add_row("time", f"{seconds:.2f} s")
    for where in (out if isinstance(out, (list, tuple)) else [out]):
        table.add_row("written to", str(where))
    console.print(table)


def check_dataset_spec(spec: str) -> tuple[str, str]:
    """``--dataset MODULE:NAME`` checked without importing anything heavy: the form, the file (a
    ``.py`` path) or the module (found on the path, the current directory included). Returns
    (MODULE, NAME); raises ValueError naming the fix."""
    import importlib.util

    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"--dataset {spec!r}: expected MODULE:NAME, e.g. my_train:build_dataset")
    if module_name.endswith(".py") or os.sep in module_name:
        if not Path(module_name).is_file():
            raise ValueError(f"--dataset {spec!r}: no such file {module_name}; give the .py file that defines "
                             f"{name}, or a module name")
        return module_name, name
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    top = module_name.partition(".")[0]  # its package only: finding a submodule imports the package
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ValueError(f"--dataset {spec!r}: no module named {top!r} here; run from the directory "
                         "that holds it, put it on PYTHONPATH, or give its .py path")
    return module_name, name


def load_dataset_spec(spec: str) -> Any:
    """The dataset ``MODULE:NAME`` names: NAME in MODULE (a module, or a ``.py`` file), called when
    it is a function or class. The current directory is importable, as with ``python -m``."""
    import importlib
    import importlib.util

    module_name, _ = check_dataset_spec(spec)
    name = spec.rpartition(":")[2]
    try:  # a Bridge dataset factory on a machine without Transformer Engine (a login node)
        from mimo_accel.tools import devkit

        devkit.prepare_imports()
    except ImportError:
        pass
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name)
        mod_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules.setdefault(path.stem, module)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    if not hasattr(module, name):
        raise ValueError(f"--dataset {spec!r}: {module_name} has no attribute {name!r}; give the name of the "
                         "dataset, or of the function returning it, that it defines")
    obj = getattr(module, name)
    return obj() if callable(obj) and not hasattr(obj, "__getitem__") else obj


def default_log_path() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "mimo-accel-index.log")


def _load_dataset_quietly(spec: str, log: Path) -> Any:
    """:func:`load_dataset_spec` with what its imports and the factory print (megatron's TE/Apex
    fallbacks, transformers' warnings) in ``log``. The dataset's own exception ends as one line; its
    traceback goes to ``log``, named in that line."""
    import traceback

    from mimo_accel.tools.quiet import output_to

    log.write_text(f"mimo-accel index --dataset {spec}, {time.strftime('%Y-%m-%d %H:%M:%S')}: third-party "
                   "output\n", encoding="utf-8")
    with output_to(log) as f:
        try:
            return load_dataset_spec(spec)
        except Exception as exc:
            traceback.print_exc(file=f)
            if isinstance(exc, ValueError) and str(exc).startswith("--dataset "):
                raise
            raise UsageError(f"--dataset {spec}: {type(exc).__name__}: {one_line(exc)} (the traceback is in "
                             f"{log})") from None


def _main_dataset(args) -> int:
    from rich.console import Console

    from mimo_accel.datasets import derive_cost_index

    given = [_flag(o) for o in ("processor", *_RULE_OPTIONS) if getattr(args, o) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to manifests only; with "
                         "--dataset the resize rule is the dataset's own processor's: drop "
                         f"{'it' if len(given) == 1 else 'them'}")
    if args.module is not None:
        raise UsageError("--module applies to manifests only; with --dataset every modality is indexed under its "
                         "own module name: drop --module")
    check_dataset_spec(args.dataset)
    output_dir("--cache-dir", args.cache_dir)
    output_file("--out", args.out)
    log = output_file("--log", args.log or default_log_path())
    start = time.perf_counter()
    from mimo_accel.datasets import cache_key, cache_path, source_for

    dataset = _load_dataset_quietly(args.dataset, log)
    verified = None
    if args.verify:
        try:
            source = source_for(dataset)
        except ValueError as exc:
            raise UsageError(f"--verify decodes the files of Bridge's MegatronMIMODataset and DirectSFTDataset: "
                             f"{one_line(exc)}") from None
        problems: list[str] = []
        verified = _verify(_dataset_files(source, problems), "decoding the dataset's files", source.base_length,
                           False, args.workers, problems)
    written: list[Any] = []
    index = derive_cost_index(dataset, cache_dir=args.cache_dir, refresh=args.refresh, progress=True,
                              workers=args.workers)
    if getattr(dataset, "mimo_accel_cost_index", None) is not None:
        described = f"{type(dataset).__name__} (carries its own index)"
    else:
        source = source_for(dataset)
        described = source.describe()
        path = cache_path(cache_key(index.identity), args.cache_dir)
        if not path.exists():  # the cache write failed: say so rather than claim it
            raise OSError(f"the cache file {path} was not written (see the warning above); give a writable "
                          "--cache-dir")
        written.append(path)
    if args.out:
        out = Path(args.out)
        index.with_identity(split=args.split).save(out)
        written.append(out)
    console = Console()
    _print_summary(console, summarize(index), written, time.perf_counter() - start, args.workers,
                   source=described, verified=verified)
    console.print(f"third-party import output: {log}", highlight=False, soft_wrap=True)
    return 0


def _main_manifest(args) -> int:
    from rich.console import Console

    if args.cache_dir is not None or args.refresh:
        raise UsageError("--cache-dir and --refresh apply to --dataset only: drop them")
    if args.log is not None:
        raise UsageError("--log applies to --dataset only (a manifest imports nothing): drop --log")
    manifest = Path(args.manifest)
    if not manifest.is_file():
        what = "is a directory" if manifest.is_dir() else "no such file"
        raise UsageError(f"{manifest}: {what}; give the JSONL manifest (one object per sample), or --dataset "
                         "MODULE:NAME")
    rule = _manifest_rule(args)
    out = Path(args.out) if args.out else default_index_path(args.manifest)
    if args.out:
        output_file("--out", out)
    elif not os.access(manifest.parent, os.W_OK | os.X_OK):
        raise UsageError(f"the index goes next to the manifest by default, but {manifest.parent} is not writable; "
                         "give --out PATH")
    start = time.perf_counter()
    size = manifest.stat().st_size
    verified = (_verify(_manifest_files(manifest), f"decoding the files of {manifest.name}", size, True, args.workers)
                if args.verify else None)
    with _progress(f"indexing {manifest.name}", size, in_bytes=True) as advance:
        index = build_index_from_manifest(args.manifest, rule, workers=args.workers,
                                          module=args.module or DEFAULT_MODULE, on_progress=advance)
    # what it describes: this manifest, and its files (build_index_from_manifest's contents digest)
    index.with_identity(manifest=_file_sha(args.manifest), split=args.split,
                        describe=f"manifest {Path(args.manifest).name}").save(out)
    _print_summary(Console(), summarize(index), out, time.perf_counter() - start, args.workers, verified=verified)
    return 0


@contextlib.contextmanager
def _progress(description: str, total: Optional[float], in_bytes: bool = False) -> Iterator[Callable[[float], None]]:
    """A rich progress bar on stderr, when stderr is a terminal (a log gets the summary alone):
    ``advance(done so far)``, ``total`` bytes (``in_bytes``) or items."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn() if in_bytes else MofNCompleteColumn(),
                  TimeRemainingColumn(), console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(description, total=total)
        yield lambda done: progress.update(task, completed=done)


def _manifest_files(manifest: Path) -> Iterator[tuple[list, int]]:
    """The image files of each chunk of the manifest (each once, at its first line), and the bytes
    of the manifest read once it is done."""
    for entries, done in manifest_chunks(manifest):
        first: dict[Path, int] = {}
        for e in entries:
            for image in e.images:
                first.setdefault(image, e.line)
        yield [(f"{manifest}:{line}", str(image), "image") for image, line in first.items()], done


def _dataset_files(source: Any, problems: list[str]) -> Iterator[tuple[list, int]]:
    """The image and audio files of each chunk of a dataset's samples, and the samples done then;
    the samples the dataset would fail to load (an empty list for an image) go to ``problems``."""
    step = 4096
    for start in range(0, source.base_length, step):
        stop = min(source.base_length, start + step)
        files = []
        for row in source.row_inputs(start, stop):
            problems.extend(row.problems)
            files.extend((f"sample {row.sample}", path, kind) for path, kind in row.files)
        yield files, stop


def _verify(batches: Iterator[tuple[list, int]], description: str, total: int, in_bytes: bool,
            workers: Optional[int], problems: Sequence[str] = ()) -> int:
    """Decode every file of ``batches`` (:mod:`mimo_accel.tools.decode_check`); the files checked,
    or a ValueError after listing on stdout, one line each, the samples that cannot be loaded
    (``problems``, filled while ``batches`` runs) and the files that cannot be decoded."""
    from mimo_accel.tools.decode_check import undecodable

    checked = 0

    def counted():
        nonlocal checked
        for files, done in batches:
            checked += len(files)
            yield files, done

    with _progress(description, total, in_bytes) as advance:
        bad = list(undecodable(counted(), workers=workers, on_progress=advance))
    for problem in problems:
        print(problem)
    for (where, path, _), why in bad:
        print(f"{where}: {path}: {why}")
    found = [f"{len(problems):,} sample{'s' if len(problems) != 1 else ''} cannot be loaded"] if problems else []
    found += [f"{len(bad):,} of {checked:,} files cannot be decoded"] if bad else []
    if found:
        raise ValueError(f"{' and '.join(found)} (listed above): fix or drop them and index again; nothing was written")
    return checked


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``mimo-accel index MANIFEST [options]`` or ``mimo-accel index --dataset MODULE:NAME``: write the
    index, print a summary. Returns 0, or 2 with one ``mimo-accel index: error:`` line."""
    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        if (args.manifest is None) == (args.dataset is None):
            raise UsageError("give a manifest or --dataset MODULE:NAME (one of the two)")
        return _main_dataset(args) if args.dataset is not None else _main_manifest(args)
    except (ValueError, OSError, ImportError) as exc:
        return fail(PROG, exc)


def _file_sha(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
