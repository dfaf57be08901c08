"""Unit tests of app/store/."""
