"""The Spark side of vqueues: a streaming source for the data topic and the pipeline jobs."""
