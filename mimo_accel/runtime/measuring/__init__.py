"""What a run measures: the profiler's timers and step lines, the figures in Bridge's TensorBoard and
W&B writers, each module's FLOPs shape, and the cost model learnt while training."""
