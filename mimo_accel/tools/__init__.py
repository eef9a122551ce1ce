"""Offline tools and the command line: report, calibrate, simulate, index, doctor, rehearse, `mimo-accel`.

Never imported by a training job that only calls ``mimo_accel.enable()``
(tests/test_runtime_imports.py).
"""
