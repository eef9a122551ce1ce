"""What a rank reads: the loader scope, this rank's share of every global micro-batch (the sharded
sampler), the plans made ahead off the training thread and agreed by every data-loading rank, and
the exchange after decoding."""
