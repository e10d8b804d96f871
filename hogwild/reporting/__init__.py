"""What a person reads: sinks (TensorBoard, tqdm, null), dashboards, timeline, staleness, words and tables."""
