"""Unit tests of bench/load/."""
