"""Device tools: tpu-info, metrics reports, profiling."""
