"""The Delta Lake implementation of the sink's table port (``tidemark.sink.port``):
``table`` (a shape's changelog and its commit protocol), ``current`` (its
current-state table), ``epochs`` (the leader's mark on every table)."""
