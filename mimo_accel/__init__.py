"""mimo_accel: sharded reads, balanced vision load and THD packing for MegatronMIMO.

Public face only; importing this module patches nothing.
"""

__version__ = "0.1.0"
