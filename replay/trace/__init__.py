"""Production traces: one request record, streaming readers per format, statistics, synthesis."""
