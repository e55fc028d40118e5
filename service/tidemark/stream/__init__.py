"""The stream: what the walsender sent, decoded and routed to the shapes.

``consumer`` takes the replication client's queue, decodes each message
(``tidemark.pgoutput``) and hands it to ``collector``, which assembles transactions,
asks the shapes which of them each change belongs to, feeds their writers and tells the
FlushTracker which shapes each transaction touched.
"""
