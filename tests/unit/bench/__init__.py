"""Unit tests of bench/."""
