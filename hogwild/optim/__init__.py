"""The optimizer's side of both processes: the lr schedule and the shared optimizer state."""
