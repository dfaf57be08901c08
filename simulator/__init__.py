"""simulator: a fake LLM upstream for tests, ``make run`` and benchmarks, speaking OpenAI's
dialect, Anthropic's Messages API and Gemini's generateContent.

Layers, imports flow downwards only:

    process   __main__.py                  command line, fd limit, signals
    network   server.py                    gevent accept loop, keep-alive loop, TCP_NODELAY
    routing   app.py                       routes, API key, fault decision, /sim/* controls
    timing    playback.py, wire.py         TTFT, tokens/s, stalls, pings, resets; writes
    state     stats.py, prompt_cache.py    counters, request log, fail-once counts; each
                                           account's prompt cache (prefix digests, expiry)
    pure      http11.py, behaviour.py,     bytes/dicts in, values out; no I/O, no gevent
              faults.py, dialects.py,      (dialects.py: which dialect a path speaks, its
              endpoints.py, responses.py,  errors; scripts.py: scripted answers, rendered
              responses_api.py, text.py,   by chat_scripts.py, anthropic.py, gemini.py;
              provider_endpoints.py,       provider_endpoints.py: the Anthropic and Gemini
              scripts.py, chat_scripts.py, routes)
              anthropic.py, gemini.py

Per-request behaviour comes from ``x-sim-<name>`` headers or a ``sim/<name>=<value>,...``
model name (see behaviour.py; for Gemini the model is in the URL path). Output is
deterministic: the same prompt gives the same words and the same embedding, and a
``script=<name>`` control gives the same scripted answer in every dialect. Nothing runs at
import time; gevent is never monkey-patched.
"""
