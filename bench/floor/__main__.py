"""`python -m bench.floor`: the gateway and its floor in turns (bench/floor/turns.py)."""

from bench.floor.turns import main

main()
