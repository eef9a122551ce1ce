"""The development kit of mimo-accel: what checks and rehearses the product, never shipped with it.

- ``rehearse/``: the CPU rehearsal kit (the CPU layer that runs the real MegatronMIMO stack on gloo
  ranks, the multi-rank harness, the tiny model stack, the example's body, the peers' stand-ins);
- ``commands/``: the development commands ``mimo-accel rehearse`` and ``mimo-accel gpu-check``.

A checkout's ``make setup`` puts it on the venv's path; the wheel holds ``mimo_accel`` only
(pyproject.toml). The product reaches it only through :mod:`mimo_accel.tools.devkit`, lazily.
"""
