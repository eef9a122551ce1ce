"""A layout as a line of text, checked: ``images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32``.

One ``NAME=tpT,ppP,dpD`` per module (the language model is ``language``; an encoder is one
pipeline stage), ``mbs=`` the global micro-batch (Bridge's MIMO ``micro_batch_size``: all the
language replicas' samples together), ``gbs=`` the global batch, and optionally ``seq=`` the
sequence length, ``first=N`` / ``last=N`` the language model's layers on its first / last PP stage
(megatron-core's ``num_layers_in_first_pipeline_stage`` / ``..._last_...``: the rest spread evenly
over the stages between) and ``frozen=NAME[,NAME]`` (encoders that do not train). A step is
W = gbs / mbs micro-batches; the micro-batch must be a multiple of G = lcm(DPs) (the canonical
grid). The grammar of ``mimo-accel layout --current`` (and ``simulate --layout``). A layout's text
is derived from its fields (:attr:`LayoutSpec.spec`), so it always says what is priced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from mimo_accel.modules import LANGUAGE, Modules, module

__all__ = ["LAYOUT_PRESETS", "LayoutSpec", "parse_layout"]

#: Upstream's one validated MegatronMIMO workflow (Megatron-Bridge,
#: ``tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md``), with the model it was chosen for.
LAYOUT_PRESETS = {"reference-27b": ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "qwen35-vl-27b")}

_MODULE = re.compile(r"^tp(\d+),pp(\d+),dp(\d+)$")
_EXAMPLE = "e.g. images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 [seq=4096] [first=30 last=34] [frozen=images]"
_COUNTS = ("mbs", "gbs", "seq", "first", "last")


@dataclass(frozen=True)
class LayoutSpec:
    """A checked layout: its modules (tp, pp, dp), the global micro-batch and batch, the sequence
    length if given, the language model's layers on its first and last stage where not even
    (None: megatron-core's even split), the frozen encoders, and the preset it came from."""

    modules: Modules
    mbs: int
    gbs: int
    frozen: tuple[str, ...] = ()
    seq_length: Optional[int] = None
    first: Optional[int] = None
    last: Optional[int] = None
    preset: Optional[str] = None

    @property
    def spec(self) -> str:
        """The layout's text, encoders first: what :func:`parse_layout` reads back."""
        m = self.modules
        parts = [f"{x.name}=tp{x.tp},pp{x.pp},dp{x.dp}" for x in (*m.encoders, m.language)]
        parts += [f"mbs={self.mbs}", f"gbs={self.gbs}"]
        parts += [f"{k}={v}" for k, v in (("seq", self.seq_length), ("first", self.first), ("last", self.last))
                  if v is not None]
        return " ".join(parts + (["frozen=" + ",".join(self.frozen)] if self.frozen else []))

    @property
    def micro_batches(self) -> int:
        return self.gbs // self.mbs

    @property
    def language(self):
        return self.modules[LANGUAGE]

    @property
    def stages(self) -> dict[str, int]:
        return {LANGUAGE: self.language.pp}

    @property
    def gpus(self) -> int:
        return self.modules.world_size

    @property
    def split(self) -> Optional[dict[str, int]]:
        """megatron-core's settings of an uneven split (None: even)."""
        named = (("num_layers_in_first_pipeline_stage", self.first), ("num_layers_in_last_pipeline_stage", self.last))
        return {k: v for k, v in named if v is not None} or None


def stage_layers(layers: int, pp: int, first: Optional[int] = None, last: Optional[int] = None) -> tuple[int, ...]:
    """Each PP stage's layers as megatron-core builds them (``get_num_layers_to_build``): ``first`` /
    ``last`` on the first / last stage where given, the rest evenly over the others. ValueError
    naming the fix where they do not divide."""
    if pp == 1:
        if first is not None or last is not None:
            raise ValueError("first=/last= split a pipeline: give them only with the language model's pp > 1")
        return (layers,)
    ends = [x for x in (first, last) if x is not None]
    left, stages = layers - sum(ends), pp - len(ends)
    if min(ends, default=1) < 1 or left < 0 or (stages and (left % stages or left < stages)) or (not stages and left):
        raise ValueError(f"first={first} last={last}: {layers} layers over {pp} stages leave {left} for the "
                         f"{stages} between, which must be a positive multiple of {max(stages, 1)}; give other counts")
    middle = left // stages if stages else 0
    out = [middle] * pp
    if first is not None:
        out[0] = first
    if last is not None:
        out[-1] = last
    return tuple(out)


def parse_layout(text: str, flag: str = "--layout") -> LayoutSpec:
    """A preset name (:data:`LAYOUT_PRESETS`) or a spec; ValueError ``<flag>: '<part>': <fix>``."""

    def bad(part: str, fix: str) -> ValueError:
        return ValueError(f"{flag}: {part!r}: {fix}")

    name = str(text).strip()
    preset = None
    if "=" not in name:
        if name not in LAYOUT_PRESETS:
            raise bad(name, f"no such preset; give one of {', '.join(LAYOUT_PRESETS)}, or a spec ({_EXAMPLE})")
        preset, name = name, LAYOUT_PRESETS[name][0]
    mods, sizes, frozen = [], {}, ()
    for part in name.split():
        key, _, value = part.partition("=")
        if not key or not value:
            raise bad(part, f"give NAME=tpT,ppP,dpD, {'=N, '.join(_COUNTS)}=N or frozen=NAME ({_EXAMPLE})")
        if key in _COUNTS:
            if key in sizes:
                raise bad(part, f"{key} is given twice; give it once")
            if not value.isdigit() or int(value) < 1:
                raise bad(part, f"{key} must be a positive whole number")
            sizes[key] = int(value)
        elif key == "frozen":
            frozen = tuple(v for v in value.split(",") if v)
        else:
            m = _MODULE.match(value)
            if not m or min(int(g) for g in m.groups()) < 1:
                raise bad(part, f"give the module's sizes as tpT,ppP,dpD with positive T, P, D, e.g. {key}=tp1,pp1,dp1")
            tp, pp, dp = (int(g) for g in m.groups())
            if key != LANGUAGE and pp > 1:
                raise bad(part, "the step model takes an encoder as one pipeline stage; give it pp1")
            try:
                mods.append(module(key, dp, tp=tp, pp=pp))
            except ValueError as e:
                raise bad(part, str(e)) from None
    names = [m.name for m in mods]
    if LANGUAGE not in names:
        raise bad(name, f"no {LANGUAGE}=tpT,ppP,dpD: the layout needs the language model")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise bad(f"{twice[0]}=", "a module is given twice; give each module once")
    for key in ("mbs", "gbs"):
        if key not in sizes:
            raise bad(name, f"no {key}=N; give the global micro-batch (mbs) and the global batch (gbs)")
    for f in frozen:
        if f not in names or f == LANGUAGE:
            raise bad(f"frozen={','.join(frozen)}", f"{f!r} is not an encoder of the layout; name encoders only")
    modules = Modules(tuple(mods))
    mbs, gbs, grid = sizes["mbs"], sizes["gbs"], modules.grid
    if mbs % grid:
        raise bad(f"mbs={mbs}", f"the global micro-batch must be a multiple of G = lcm(DPs) = {grid}")
    if gbs % mbs:
        raise bad(f"gbs={gbs}", f"the global batch must be a whole number of micro-batches of mbs={mbs}")
    if modules[LANGUAGE].pp == 1 and ("first" in sizes or "last" in sizes):
        raise bad("first=/last=", "they split the language model's pipeline: give them only with its pp > 1")
    return LayoutSpec(modules, mbs, gbs, frozen, sizes.get("seq"), sizes.get("first"), sizes.get("last"), preset)
