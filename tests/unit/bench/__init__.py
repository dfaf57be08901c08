"""Unit tests of bench/, a folder for each of its subpackages."""
