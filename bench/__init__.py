"""Benchmarks: print ratios against direct-to-upstream and nginx-only runs. Never asserts."""
