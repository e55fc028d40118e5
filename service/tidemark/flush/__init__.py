"""The flush boundary: which LSN tidemark may confirm to Postgres (pure, no IO).

``FlushTracker`` (``tracker.py``) turns per-shape flush notices into one durable LSN;
``TxnAlignment`` (``alignment.py``) is the writer-side half that aligns each writer's
flushed offsets to transaction boundaries before they reach the tracker.
"""

from tidemark.flush.alignment import TxnAlignment
from tidemark.flush.tracker import CommitFragment, FlushTracker, StalledShape, TxnFragment

__all__ = ["CommitFragment", "FlushTracker", "StalledShape", "TxnAlignment", "TxnFragment"]
