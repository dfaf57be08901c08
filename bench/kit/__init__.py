"""What every measurement shares: the report's contract (report.py), the closed-loop load
generator (loadgen.py), CPU and memory of process trees from /proc (proctree.py), the
machine's facts and noise (machine.py), and the report's plots (plots.py)."""
