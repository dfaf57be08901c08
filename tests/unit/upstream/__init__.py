"""Unit tests of app/upstream/."""
