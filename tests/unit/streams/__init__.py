"""Unit tests of app/streams/."""
