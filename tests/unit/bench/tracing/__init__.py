"""Unit tests of bench/tracing/."""
