"""Non-colocated MIMO layouts: each encoder on its own ranks, in order, the language module after them.

``MimoLayout(vision, language)`` is the one-encoder layout it always was (vision on ranks [0, V),
language after it). Any number of encoders, each named as the user's config names it
(``"vision"``, ``"audio"``, upstream's own ``"images"`` / ``"audios"``):
``MimoLayout.of({"vision": ModuleLayout(dp=2), "audio": ModuleLayout(dp=1)}, ModuleLayout(dp=1))``
puts vision on [0, 2), audio on [2, 3) and language on [3, 4).

Pure (no torch, no megatron at import): shared by the workload profiles, the test harness and the
rehearsal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

VISION = "vision"
LANGUAGE = "language"  # megatron.core.models.mimo.config.role.MIMO_LANGUAGE_MODULE_KEY


@dataclass(frozen=True)
class ModuleLayout:
    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def size(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(frozen=True, init=False)
class MimoLayout:
    """A non-colocated layout: the encoders on consecutive ranks in their order, then the language
    module. ``MimoLayout(vision, language)``: one encoder named ``"vision"``."""

    encoders: tuple[tuple[str, ModuleLayout], ...]  # (name, layout) in rank order
    language: ModuleLayout

    def __init__(self, vision: Optional[ModuleLayout] = None, language: Optional[ModuleLayout] = None, *,
                 encoders: Optional[Mapping[str, ModuleLayout]] = None):
        if encoders is not None and vision is not None:
            raise TypeError("MimoLayout: give the vision layout or encoders=, not both")
        if encoders is None:
            encoders = {VISION: vision if vision is not None else ModuleLayout()}
        pairs = tuple((str(name), m) for name, m in dict(encoders).items())
        if not pairs:
            raise ValueError("MimoLayout: a non-colocated layout needs at least one encoder")
        if any(name == LANGUAGE for name, _ in pairs):
            raise ValueError(f"MimoLayout: {LANGUAGE!r} is the language module's name, not an encoder's")
        for name, m in pairs:
            if not isinstance(m, ModuleLayout):
                raise TypeError(f"MimoLayout: encoder {name!r} needs a ModuleLayout, got {type(m).__name__}")
        object.__setattr__(self, "encoders", pairs)
        object.__setattr__(self, "language", language if language is not None else ModuleLayout())

    @classmethod
    def of(cls, encoders: Mapping[str, ModuleLayout], language: ModuleLayout) -> "MimoLayout":
        """Encoders by name, in rank order, then ``language``."""
        return cls(language=language, encoders=encoders)

    @classmethod
    def from_dp(cls, vision_dp: int, language_dp: int, **encoder_dps: int) -> "MimoLayout":
        """DP sizes only: vision, then the ``encoder_dps`` encoders in their order, then language."""
        encoders = {VISION: ModuleLayout(dp=vision_dp), **{n: ModuleLayout(dp=d) for n, d in encoder_dps.items()}}
        return cls.of(encoders, ModuleLayout(dp=language_dp))

    @property
    def encoder_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.encoders)

    def encoder(self, name: str) -> ModuleLayout:
        for n, m in self.encoders:
            if n == name:
                return m
        raise KeyError(f"no encoder {name!r} in this layout (encoders: {', '.join(self.encoder_names)})")

    @property
    def vision(self) -> ModuleLayout:
        """The encoder named ``"vision"``; with no such name, the only encoder."""
        names = self.encoder_names
        if VISION in names:
            return self.encoder(VISION)
        if len(names) == 1:
            return self.encoders[0][1]
        raise AttributeError(f"this layout has no encoder named {VISION!r} and more than one encoder "
                             f"({', '.join(names)}): ask for one by name (layout.encoder(name))")

    @property
    def world_size(self) -> int:
        return sum(m.size for _, m in self.encoders) + self.language.size

    def modules(self) -> dict[str, tuple[ModuleLayout, int]]:
        """Module name -> (layout, rank offset), in rank order (the encoders, then language)."""
        out, offset = {}, 0
        for name, m in self.encoders:
            out[name] = (m, offset)
            offset += m.size
        out[LANGUAGE] = (self.language, offset)
        return out

    def dp_sizes(self) -> dict[str, int]:
        """Module name -> DP size, in rank order."""
        return {name: m.dp for name, (m, _) in self.modules().items()}

    def parallelism_config(self):
        """The Bridge ``MegatronMIMOParallelismConfig`` for this layout (finalized)."""
        from megatron.bridge.models.megatron_mimo.megatron_mimo_config import (
            MegatronMIMOParallelismConfig,
            ModuleParallelismConfig,
        )

        cfg = MegatronMIMOParallelismConfig(
            module_parallelisms={
                name: ModuleParallelismConfig(
                    tensor_model_parallel_size=m.tp,
                    pipeline_model_parallel_size=m.pp,
                    data_parallel_size=m.dp,
                    rank_offset=offset,
                )
                for name, (m, offset) in self.modules().items()
            }
        )
        cfg.finalize(self.world_size)
        return cfg

    def __str__(self) -> str:
        def one(name: str, m: ModuleLayout) -> str:
            return f"{name}(tp{m.tp},pp{m.pp},dp{m.dp})"

        return "+".join(one(n, m) for n, m in self.encoders) + "->" + one(LANGUAGE, self.language)
