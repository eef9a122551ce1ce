"""The CPU rehearsal kit: run the real MegatronMIMO stack on CPU/gloo ranks (the CPU layer, the
multi-rank harness, the tiny model stack, workload profiles, `mimo-accel rehearse`).

Never imported by a training job that only calls ``mimo_accel.enable()``
(tests/test_runtime_imports.py).
"""
