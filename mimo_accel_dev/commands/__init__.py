"""The development commands the CLI (``mimo_accel.tools.cli``) runs from the kit: ``rehearse``
(``rehearse.py``, with ``rehearse_reference.py`` and the output of both in ``rehearsal_output.py``)
and ``gpu-check`` (``gpu_check.py``)."""
