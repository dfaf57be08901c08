"""Unit tests of app/edge/ (and gunicorn.conf.py's worker hook)."""
