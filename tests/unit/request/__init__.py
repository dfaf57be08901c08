"""Unit tests of app/request/."""
