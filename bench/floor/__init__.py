"""The shape's floor: an app that only relays (app.py), served by the gateway's own stack in
its place, and the gateway measured against it (turns.py, `python -m bench.floor`), each of
the floor's choices (layers.py) and where the gap goes (profile.py).

Nothing is imported here: app.py reads its upstream from the environment when imported."""

# The floor's app, as gunicorn's APP_MODULE argument (runner.stack.StackOptions.wsgi_app).
FLOOR_APP = "bench.floor.app:app"
