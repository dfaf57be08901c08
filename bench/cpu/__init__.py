"""What one call costs: two revisions' stacks in turns (ab.py); the app alone in one process,
timed or counted by cachegrind (call_cpu.py, hit_cpu.py, grant_cpu.py); where a worker's CPU
goes (profile.py, py-spy); what a keyed call asks of Memcached (counter_trips.py); gunicorn's
parsers (parser.py); and translated calls, through the stack and the translators alone
(translation.py, the report's section)."""
