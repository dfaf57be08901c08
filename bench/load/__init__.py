"""The whole stack under load, through nginx → gunicorn: the report's overhead, memory, cache
and capacity sections, the peers' two measures (compare.py) and a cluster (cluster.py)."""
