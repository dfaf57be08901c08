"""Unit tests of runner/ (and the nginx template it renders)."""
