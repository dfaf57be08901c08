"""Unit tests of app/observe/."""
