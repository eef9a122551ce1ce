"""The package version: its own module, so nothing inside mimo_accel imports the package root for it."""

__version__ = "0.1.0"
