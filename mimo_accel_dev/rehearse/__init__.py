"""The CPU rehearsal kit: run the real MegatronMIMO stack on CPU/gloo ranks (the CPU layer, the
multi-rank harness, the tiny model stack, the example's body, the runs `mimo-accel rehearse` compares).

Never imported by a training job that only calls ``mimo_accel.enable()``
(tests/test_runtime_imports.py).
"""
