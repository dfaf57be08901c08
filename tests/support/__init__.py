"""Test support: real servers on loopback, as plain classes with no pytest dependency.

Fixtures in the conftest files wrap these; benchmarks and scripts may use them directly.
"""
