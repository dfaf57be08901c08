"""Unit tests of app/gateway.py."""
