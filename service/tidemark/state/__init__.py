"""What survives a crash and who may write it, beneath everything that keeps state:
``durable`` (the order of writes and syncs on a local disk), ``objectstore`` (one
interface over a local folder and an ``s3://`` root: put-if-absent, replace-if-unchanged),
``instance_state`` (where an instance's state files live under a root), ``lease`` (who
should lead: an advisory lock on the source) and ``fencing`` (what stops a leader that
lost it: epochs checked by the store itself)."""
