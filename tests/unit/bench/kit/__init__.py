"""Unit tests of bench/kit/."""
