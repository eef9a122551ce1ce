"""Non-colocated MIMO layouts: the vision module on ranks [0, V), the language module after it.

Pure (no torch, no megatron at import): shared by the workload profiles, the test harness and the
rehearsal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class MimoLayout:
    """A non-colocated layout: the vision module on ranks [0, V), the language module after it."""

    vision: ModuleLayout = field(default_factory=ModuleLayout)
    language: ModuleLayout = field(default_factory=ModuleLayout)

    @classmethod
    def from_dp(cls, vision_dp: int, language_dp: int) -> "MimoLayout":
        return cls(ModuleLayout(dp=vision_dp), ModuleLayout(dp=language_dp))

    @property
    def world_size(self) -> int:
        return self.vision.size + self.language.size

    def modules(self) -> dict[str, tuple[ModuleLayout, int]]:
        """Module name -> (layout, rank offset)."""
        return {VISION: (self.vision, 0), LANGUAGE: (self.language, self.vision.size)}

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
        v, l = self.vision, self.language
        return f"vision(tp{v.tp},pp{v.pp},dp{v.dp})->language(tp{l.tp},pp{l.pp},dp{l.dp})"
