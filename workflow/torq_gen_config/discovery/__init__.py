"""Discovery: one (layer, executor) verdict (layer_test) and the compile batches that
compile many layers (or partitions) in one iree-compile (batch_compile)."""
