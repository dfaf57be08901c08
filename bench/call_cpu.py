"""`python -m bench.call_cpu`: what a call costs the app alone, timed or counted
(bench/cpu/call_cpu.py).

Kept at this name because the command is quoted in issues and notes."""

from bench.cpu.call_cpu import main

if __name__ == "__main__":
    main()
