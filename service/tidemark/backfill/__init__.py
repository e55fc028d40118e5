"""Consistent snapshots for new shapes and resyncs, merged with the live stream."""
