"""What traces cost: the tail latency with a collector working, silent or absent
(trace_latency.py, a section of the report) and the CPU per call with traces off, on and
sampled (cost.py, `python -m bench.tracing`; docs/observability.md)."""
