"""`python -m bench.ab A B`: two revisions' gateway CPU per call, in turns (bench/cpu/ab.py).

Kept at this name because the command is quoted in issues and notes."""

from bench.cpu.ab import main

if __name__ == "__main__":
    main()
