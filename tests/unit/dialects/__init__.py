"""Unit tests of app/dialects/."""
