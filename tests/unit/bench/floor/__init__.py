"""Unit tests of bench/floor/."""
