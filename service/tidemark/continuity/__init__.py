"""Continuity: a shape's table follows *one* stream without a gap.

A shape's backfill record is a **claim**: "this table holds the snapshot taken at
LSN S plus every later transaction of this stream". The claim is only as good as
the stream it names, so the stream's identity is part of it:

* the source system (``IDENTIFY_SYSTEM``'s system identifier) and its timeline;
* the slot's name and origin (the LSN at which tidemark created it, or first
  streamed from it), together with an *epoch* number that grows each time
  tidemark adopts a new stream;
* the highest flush LSN tidemark ever sent for the slot, persisted *before* it is
  sent: Postgres moves ``confirmed_flush_lsn`` only when a client says so, so a
  slot whose position is beyond it was recreated, advanced or consumed by someone
  else, and whatever happened in between never reached the shapes.

The rule, in one sentence: whatever ends a claim (the shape stops being routed:
removed, resync pending or failed, a schema it cannot follow; the slot or the
source changed) invalidates it durably before anything is acknowledged past that
point, and a start or reconnect never resumes over a gap: ``on_stream_gap =
"fail"`` stops with what happened and how to resync; ``"resync"`` re-snapshots
every claimed shape from the stream that is there now.

``rule`` holds the decision (pure); ``store`` is the one place the claims, the
stream record and the last sent flush are persisted.
"""
