"""``setup_megatron_mimo`` as ``pretrain_megatron_mimo`` calls it (looked up in its module globals at
call time, whatever the script imported): before the model is built, one reorder per micro-batch
is settled, the provider is read and checked, the checkpoint it resumes from is checked against
this layout (:mod:`mimo_accel.runtime.resume`), online calibration starts, and the script's own
``build_data_iterators_fn`` runs inside a loader scope."""

from __future__ import annotations

import functools
from typing import Callable, Optional

from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing
from mimo_accel.runtime.provider import frozen_encoders, read_provider, start_calibration
from mimo_accel.runtime.reading.scope import loader_scope
from mimo_accel.runtime.resume import check_before_load
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.upstream_reorder import refuse_second_reorder, settle_upstream_reorder


def scoped_iterators(build: Optional[Callable], runtime: Runtime) -> Optional[Callable]:
    """The script's ``build_data_iterators``, run inside a loader scope (its signature kept: setup
    inspects it for ``train_state``), its iterators checked for a second reorder."""
    if build is None:
        return None

    @functools.wraps(build)
    def build_data_iterators(*a, **k):
        with loader_scope(runtime):
            iterators = build(*a, **k)
        refuse_second_reorder(iterators, runtime)
        return iterators

    return build_data_iterators


def wrap_setup(original: Callable, runtime: Runtime) -> Callable:
    @replacing(original)
    def setup_megatron_mimo(call: UpstreamCall):
        cfg = getattr(call["state"], "cfg", None)
        provider = getattr(cfg, "model", None)
        settle_upstream_reorder(cfg, runtime)  # a Bridge that reorders itself: never two reorders
        runtime.frozen = frozen_encoders(provider)
        read_provider(provider, runtime)
        runtime.resumed = check_before_load(cfg, runtime.say_once)
        start_calibration(call["state"], runtime)
        build = scoped_iterators(call["build_data_iterators_fn"], runtime)
        return (call.but(build_data_iterators_fn=build) if build is not None else call).to(original)

    return setup_megatron_mimo
