"""What the running service shows its readers: its state taken as values (``facts``)
and the pure rules that turn them into what a user reads (``readiness``)."""
