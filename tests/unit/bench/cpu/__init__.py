"""Unit tests of bench/cpu/."""
