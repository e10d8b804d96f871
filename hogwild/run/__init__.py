"""The orchestrator: the recipe, pre-flight, the loop and its state, supervisor, evaluation, checkpoints, the run folder, the summary."""
