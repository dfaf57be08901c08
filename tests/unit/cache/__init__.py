"""Unit tests of app/cache/."""
