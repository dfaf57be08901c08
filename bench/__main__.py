"""`make bench` / `python -m bench`: the relay benchmark (see bench/relay.py)."""

from bench.relay import cli

cli()
