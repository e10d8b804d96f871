"""The node seam: one node alone, torchrun nodes, model-averaging rounds."""
