"""The lake side: one Delta table per shape, committed offsets, frontiers."""
