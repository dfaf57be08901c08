"""Unit tests of bench/client/."""
