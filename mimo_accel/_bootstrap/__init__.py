"""The launcher's sitecustomize directory (put on PYTHONPATH by `mimo-accel run`)."""
