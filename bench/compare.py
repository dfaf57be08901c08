"""`python -m bench.compare`: llmgate measured the two ways peers publish their numbers
(bench/load/compare.py).

Kept at this name because the command is quoted in issues and notes."""

from bench.load.compare import main

if __name__ == "__main__":
    main()
