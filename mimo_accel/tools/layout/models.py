"""The model whose layout is chosen: each module's FLOPs per token and per Σ L², its parameters,
what a layer stores for its backward, and the sizes its parallelism must divide. From a preset
(:data:`MODEL_PRESETS`), a small YAML file (:func:`load_model`), or a profile's header
(:meth:`ModuleModel.from_shape`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from mimo_accel.costs.flops import FlopsShape
from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout.memory import ParameterCount, attention_bytes, linear_attention_bytes, parameter_count

__all__ = ["DEFAULT_MODEL", "MODEL_PRESETS", "ModelSpec", "ModuleModel", "load_model", "model_named"]


@dataclass(frozen=True)
class ModuleModel:
    """One module as the advisor prices it: forward FLOPs ``per_token`` (a token, or an encoder's
    row; ``output_per_token`` of it the language model's output layer, on its last PP stage) and
    ``per_sq_token`` (per unit of Σ L², its attention), its parameters, and the sizes a TP must
    divide (``heads``, ``query_groups`` and any ``tp_divides``) or a PP its ``layers``. An encoder
    sends ``out_hidden``-wide rows, one per ``merge``² of its rows, to the language model.
    ``linear_layers`` of its layers are linear attention (Gated DeltaNet), each storing
    ``linear_bytes`` per token for its backward where an attention layer stores ``attention_bytes``
    (the mixers' parts TP splits: :func:`~mimo_accel.tools.layout.memory.attention_bytes`); its MLP
    stores ``mlp_bytes`` (6F with SwiGLU, 4F with GeLU)."""

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    query_groups: int
    per_token: float
    per_sq_token: float
    params: ParameterCount
    vocab: int = 0
    merge: int = 1
    out_hidden: int = 0
    trained: bool = True
    tp_divides: tuple[int, ...] = ()
    output_per_token: float = 0.0
    linear_layers: int = 0
    linear_bytes: float = 0.0
    attention_bytes: float = 0.0
    mlp_bytes: float = 0.0

    @property
    def is_language(self) -> bool:
        return self.name == LANGUAGE

    def forward(self, tokens: float, sq_tokens: float) -> float:
        """Forward FLOPs over sequences of Σ L = ``tokens``, Σ L² = ``sq_tokens`` (what
        :func:`mimo_accel.costs.flops.throughput` asks of a shape)."""
        return self.per_token * tokens + self.per_sq_token * sq_tokens

    def tp_fits(self, tp: int) -> bool:
        return all(d % tp == 0 for d in (self.heads, self.query_groups, *self.tp_divides))

    @classmethod
    def from_shape(cls, name: str, shape: FlopsShape, *, trained: bool = True, tied: bool = False,
                   extra_params: float = 0.0, qk_norm: bool = False) -> "ModuleModel":
        encoder = name != LANGUAGE
        params = parameter_count(shape, tied=tied, encoder=encoder)
        if extra_params:
            params = replace(params, other=params.other + extra_params)
        return cls(name=name, layers=shape.layers, hidden=shape.hidden, ffn_hidden=shape.ffn_hidden,
                   heads=shape.heads, query_groups=shape.query_groups, per_token=shape.per_token,
                   per_sq_token=shape.per_sq_token, params=params, vocab=shape.vocab,
                   merge=max(1, shape.merge) if encoder else 1,
                   out_hidden=(shape.out_hidden or shape.hidden) if encoder else 0, trained=trained,
                   output_per_token=0.0 if encoder else 2.0 * shape.hidden * shape.vocab,
                   attention_bytes=attention_bytes(shape, qk_norm),
                   mlp_bytes=(6.0 if shape.gated else 4.0) * shape.ffn_hidden)


@dataclass(frozen=True)
class ModelSpec:
    """Every module of a model (encoders first, then ``language``), the sequence length it is
    trained at by default, and where the figures come from."""

    name: str
    modules: Mapping[str, ModuleModel]
    seq_length: Optional[int] = None
    gbs: Optional[int] = None
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    image_pixels: Optional[tuple[int, int]] = None  # the processor's (min, max) pixels an image is resized into

    def __post_init__(self) -> None:
        if LANGUAGE not in self.modules or len(self.modules) < 2:
            raise ValueError(f"model {self.name}: give the {LANGUAGE!r} module and at least one encoder "
                             f"(modules: {', '.join(self.modules) or 'none'})")

    @property
    def encoders(self) -> tuple[str, ...]:
        return tuple(m for m in self.modules if m != LANGUAGE)

    @property
    def frozen(self) -> tuple[str, ...]:
        return tuple(m for m, mm in self.modules.items() if not mm.trained)

    def with_frozen(self, frozen) -> "ModelSpec":
        return replace(self, modules={n: replace(m, trained=m.trained and n not in frozen)
                                      for n, m in self.modules.items()})


def qwen35_vl_27b() -> ModelSpec:
    """Qwen3.5-VL 27B (dense), the model of Megatron-Bridge's MegatronMIMO tutorial
    (``tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md``): modules ``images`` and
    ``language``, the names its launcher uses; sequence length 4096 and global batch 32, the
    launcher's defaults (``examples/megatron_mimo/qwen35_vl/slurm_sft.sh``); images resized into
    200,704 … 1,003,520 pixels, the example's collate defaults (``QWEN_VL_MIN_PIXELS`` /
    ``QWEN_VL_MAX_PIXELS``, ``src/megatron/bridge/models/qwen_vl/data/collate_fn.py``): at most
    3,920 patches of 16 px an image.

    Language model (Megatron-Bridge ``src/megatron/bridge/models/qwen_vl/qwen35_vl_provider.py``,
    ``Qwen35VLModelProvider``: "64 layers: 16 groups x (3 GDN + 1 Attention), hidden 5120,
    intermediate 17408, GDN: 16 QK heads, 48 V heads, head_dim=128, Gated Attention: 24 Q heads,
    4 KV heads, head_dim=256", ``attention_output_gate=True``, ``linear_attention_freq=4``,
    ``linear_conv_kernel_dim=4``, ``gated_linear_unit=True``; vocabulary 248320 and untied
    embeddings from ``tests/unit_tests/models/qwen_vl/test_qwen35_vl_bridge.py``
    ``_make_dense_text_config``, "matching Qwen3.5-27B"). It is hybrid: every 4th layer is full
    (gated) attention, the other 48 are Gated DeltaNet linear attention, so only 16 layers have an
    L² term. Forward FLOPs per token, as Bridge's ``flop_utils.num_floating_point_operations``
    counts them (its count / 3), h 5120, F 17408, q = 24·256 = 6144, kv = 4·256 = 1024::

        MLP, every layer           2·3·h·F                                   =    534,773,760  × 64
        full attention, 16 layers  2h·(q + 2kv + q_gate) + 2q·h              =    209,715,200  × 16
        Gated DeltaNet, 48 layers  2·(h·(2·2048 + 2·6144 + 2·48)             =    238,043,136  × 48
                                      + 4·(2·2048 + 6144) + 4·48·128² + h·6144)
        output layer               2·h·V                                     =  2,542,796,800
        per token                                                            = 51,549,831,168
        per Σ L² (causal, the 16 full-attention layers only)  16 · 4q · ½    =        196,608

    Parameters: a DeltaNet layer h·16480 + 4·10240 + 6144·h + 4h = 115,896,320, a full-attention
    layer 2h·q + 2h·kv + h·q + 4h = 104,878,080, the MLP 3·h·F = 267,386,880: 24,353,832,960 in the
    layers, 1,271,398,400 each for the embedding and the output layer (26.9 B in all).

    What a layer stores for its backward, per token, in bf16, the parts TP splits (besides its two
    norms': :func:`~mimo_accel.tools.layout.memory.stored_per_token`): the SwiGLU MLP 6F =
    104,448; a gated attention layer (``attention_output_gate``, ``qk_layernorm``) 96,576
    (:func:`~mimo_accel.tools.layout.memory.attention_bytes`); a Gated DeltaNet layer as
    megatron-core's ``GatedDeltaNet`` runs it on GPUs (``ssm/gated_delta_net/gdn.py``, with FLA's
    conv, l2norm and chunked kernel; ``torch.compile``'s regions keeping their inputs), 16 key and 48
    value heads of 128, qk = 2,048, v = 6,144::

        the conv's input, made contiguous by FLA          2 · (2qk + v)            =  20,480
        FLA's l2norm of q and k: output, rstd             2 · 2qk + 4 · 2 · 16     =   8,320
        q and k repeated up to the 48 value heads         2 · 2 · 48 · 128         =  24,576
          (``_prepare_input_for_gated_delta_rule``, ``ssm/gated_delta_net/common.py``)
        the kernel's v, g (fp32), β, A (64-token chunks)  2v + 4·48 + 2·48 + 2·48·64 = 18,720
        g's input α                                       2 · 48                   =      96
        the gated norm: its input o, the gate z, rstd     2v + 2v + 4 · 48         =  24,768
        the output projection's input                     2v                       =  12,288
                                                                                   = 109,248

    (:func:`~mimo_accel.tools.layout.memory.linear_attention_bytes`; FLA's saved tensors from its
    source, ``ChunkGatedDeltaRuleFunction`` and its conv and l2norm; tests/test_layout_terms.py
    counts megatron-core's layer on CPU with FLA's GPU kernels stood in for).

    Image encoder (transformers ``models/qwen3_5/configuration_qwen3_5.py``,
    ``Qwen3_5VisionConfig`` defaults, which the provider builds: depth 27, hidden 1152,
    intermediate 4304, 16 heads, GELU MLP, spatial merge 2; the provider: "Vision: depth=27,
    hidden=1152, no deepstack"), its merger's output 5120 wide (the language model's hidden size:
    its rows are the language model's image embeddings): a standard encoder, counted by
    :class:`~mimo_accel.costs.flops.FlopsShape` (844,554,240 FLOPs per row, 124,416 per Σ rows²),
    460 M parameters with its patch (1536·1152) and position (2304·1152) embeddings.
    """
    h, ffn, vocab = 5120, 17408, 248320
    mlp, full, gdn, out = 2 * 3 * h * ffn, 209_715_200, 238_043_136, 2 * h * vocab
    per_token = 64 * mlp + 16 * full + 48 * gdn + out
    layer_params = 48 * (115_896_320 + 267_386_880) + 16 * (104_878_080 + 267_386_880)
    language = ModuleModel(
        name=LANGUAGE, layers=64, hidden=h, ffn_hidden=ffn, heads=24, query_groups=4, per_token=float(per_token),
        per_sq_token=16 * 4.0 * 6144 * 0.5,
        params=ParameterCount(layers=float(layer_params), embedding=float(h * vocab), output=float(h * vocab),
                              other=2.0 * h),
        vocab=vocab, tp_divides=(16, 48),  # the DeltaNet's key and value heads split over TP too
        output_per_token=float(out), linear_layers=48, linear_bytes=linear_attention_bytes(16, 48, 128, 128),
        mlp_bytes=6.0 * ffn,
        attention_bytes=attention_bytes(FlopsShape(layers=16, hidden=h, ffn_hidden=ffn, heads=24, query_groups=4,
                                                   kv_channels=256, gated=True, output_gate=True), qk_norm=True))
    vision = FlopsShape(layers=27, hidden=1152, ffn_hidden=4304, heads=16, query_groups=16, kv_channels=72,
                        gated=False, causal=False, merge=2, out_hidden=5120)
    images = ModuleModel.from_shape("images", vision, extra_params=float(1536 * 1152 + 2304 * 1152))
    return ModelSpec("qwen35-vl-27b", {"images": images, LANGUAGE: language}, seq_length=4096, gbs=32,
                     source="preset qwen35-vl-27b (Megatron-Bridge's Qwen3.5-VL provider, transformers' config)",
                     image_pixels=(200_704, 1_003_520))


MODEL_PRESETS = {"qwen35-vl-27b": qwen35_vl_27b}
DEFAULT_MODEL = "qwen35-vl-27b"

# what a module of a model file may give, and of which type: FlopsShape's fields, plus these
_WHOLE = ("layers", "hidden", "ffn_hidden", "heads", "query_groups", "kv_channels", "vocab", "merge", "out_hidden")
_SWITCHES = ("gated", "causal", "output_gate", "frozen", "tied", "qk_layernorm")
_AMOUNTS = ("per_token_flops", "per_sq_token_flops", "parameters")
_TOP_KEYS = {"name", "seq_length", "gbs", "modules", "min_pixels", "max_pixels"}


def _typed(where: str, d: Mapping, key: str, kind: str, default: Any = None) -> Any:
    """``d[key]`` as a whole number >= 1 (``whole``; 0 allowed for vocab/merge/out_hidden), a YAML
    boolean (``switch``) or a number >= 0 (``amount``); ValueError naming the key, file and fix."""
    if key not in d:
        return default
    v = d[key]
    if kind == "switch":
        if not isinstance(v, bool):
            raise ValueError(f"{where}{key}: {v!r} is not a boolean; write true or false, unquoted")
        return v
    if kind == "whole":
        low = 0 if key in ("vocab", "merge", "out_hidden") else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{where}{key}: {v!r} is not a whole number >= {low}; give one, e.g. {key}: 8")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
        raise ValueError(f"{where}{key}: {v!r} is not a number >= 0; give one, e.g. {key}: 1.5e9")
    return float(v)


def _module_of(path: str, name: str, d: Any) -> ModuleModel:
    where = f"{path}: modules.{name}"
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: give a mapping of {', '.join(_WHOLE)}, ...")
    unknown = sorted(set(d) - set(_WHOLE) - set(_SWITCHES) - set(_AMOUNTS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; a module has {', '.join((*_WHOLE, *_SWITCHES, *_AMOUNTS))}")
    missing = [k for k in ("layers", "hidden", "ffn_hidden", "heads") if k not in d]
    if missing:
        raise ValueError(f"{where}: give {', '.join(missing)} (and query_groups, kv_channels where they differ "
                         "from heads, hidden/heads)")
    n = {k: _typed(f"{where}.", d, k, "whole") for k in _WHOLE}
    s = {k: _typed(f"{where}.", d, k, "switch", k == "causal" and name == LANGUAGE) for k in _SWITCHES}
    a = {k: _typed(f"{where}.", d, k, "amount") for k in _AMOUNTS}
    heads, groups = n["heads"], n["query_groups"] or n["heads"]
    if heads % groups:
        raise ValueError(f"{where}.query_groups: {groups} does not divide heads ({heads}); give a divisor of it")
    if n["kv_channels"] is None and n["hidden"] % heads:
        raise ValueError(f"{where}.kv_channels: hidden ({n['hidden']}) is not a multiple of heads ({heads}); give "
                         "kv_channels")
    if name == LANGUAGE and not n["vocab"]:
        raise ValueError(f"{where}: give the language model's vocab (its output layer's size)")
    if name == LANGUAGE and s["frozen"]:
        raise ValueError(f"{where}.frozen: the language model trains in the step model; freeze encoders only")
    shape = FlopsShape(layers=n["layers"], hidden=n["hidden"], ffn_hidden=n["ffn_hidden"], heads=heads,
                       query_groups=groups, kv_channels=n["kv_channels"] or n["hidden"] // heads, gated=s["gated"],
                       vocab=n["vocab"] or 0, causal=s["causal"], output_gate=s["output_gate"], merge=n["merge"] or 0,
                       out_hidden=n["out_hidden"] or 0)
    m = ModuleModel.from_shape(name, shape, trained=not s["frozen"], tied=s["tied"], qk_norm=s["qk_layernorm"])
    overrides = {attr: a[key] for key, attr in (("per_token_flops", "per_token"), ("per_sq_token_flops",
                                                                                   "per_sq_token")) if a[key] is not None}
    if a["parameters"] is not None:  # the layers' parameters, where the FLOPs shape cannot count them (hybrid layers)
        overrides["params"] = replace(m.params, layers=a["parameters"])
    return replace(m, **overrides)


def load_model(path: str) -> ModelSpec:
    """A model file: ``name``, ``seq_length``, ``gbs`` (optional) and ``modules: {NAME: {layers,
    hidden, ffn_hidden, heads, query_groups, kv_channels, vocab, gated, causal, output_gate, merge,
    out_hidden, frozen, tied, per_token_flops, per_sq_token_flops, parameters}}``: sizes whole
    numbers, switches YAML booleans, each key checked."""
    import yaml

    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--model {path}: {e.strerror}; give a preset ({', '.join(MODEL_PRESETS)}) or a YAML model "
                         "file") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--model {path}: not valid YAML ({' '.join(str(e).split())}); fix the syntax") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("modules"), Mapping):
        raise ValueError(f"--model {path}: give a mapping with modules: {{language: {{...}}, <encoder>: {{...}}}}")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"--model {path}: unknown keys {unknown}; a model file has {', '.join(sorted(_TOP_KEYS))}")
    mods = {str(n): _module_of(str(path), str(n), d) for n, d in doc["modules"].items()}
    ordered = {n: m for n, m in mods.items() if n != LANGUAGE}
    if LANGUAGE in mods:
        ordered[LANGUAGE] = mods[LANGUAGE]
    top = {k: _typed(f"--model {path}: ", doc, k, "whole") for k in ("seq_length", "gbs", "min_pixels", "max_pixels")}
    if top["min_pixels"] is not None and top["max_pixels"] is None:
        raise ValueError(f"--model {path}: give max_pixels with min_pixels (whole numbers of pixels)")
    pixels = (top["min_pixels"] or 0, top["max_pixels"]) if top["max_pixels"] is not None else None
    try:
        return ModelSpec(str(doc.get("name", p.stem)), ordered, top["seq_length"], top["gbs"],
                         source=f"model file {path}", image_pixels=pixels)
    except ValueError as e:
        raise ValueError(f"--model {path}: {e}") from None


def model_named(name: str) -> ModelSpec:
    """A preset by name, or a model file by path."""
    if name in MODEL_PRESETS:
        return MODEL_PRESETS[name]()
    if not Path(name).suffix and not Path(name).exists():
        raise ValueError(f"--model {name}: no such preset; give one of {', '.join(MODEL_PRESETS)}, or a YAML model file")
    return load_model(name)
