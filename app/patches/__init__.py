"""Patches of dependencies' internals: one module each, saying what it replaces and why.

Each is a last resort of the performance work, kept because it saves a measured share of
every call (docs/performance.md). The rule every module here follows:

- ``fits()`` looks at the installed library's internals the patch relies on (the names its
  code reads and writes, the behaviour it must equal) and returns None when they are what
  the patch was written against, else the reason they are not;
- the patch is used only when it fits: otherwise the library's own path runs (slower, never
  wrong) and one warning says so (``refuse``), once per process;
- tests/unit/patches/ holds each patch to the versions requirements.txt pins (its ``fits``
  is None there, and the patched path gives what the library's own gives), so a new
  version whose internals moved fails a test before it reaches a worker.

The patches: ``http_headers`` (http.client's header parser), ``prometheus_values`` (the
multiprocess value class), ``prometheus_labels`` (each metric's label lookup),
``chunked_reads`` (a chunked body read beneath urllib3's response). No I/O here.
"""

from __future__ import annotations

import logging

log = logging.getLogger("llmgate.patches")
_refused: set[str] = set()


def refuse(name: str, reason: str) -> None:
    """The patch ``name`` does not fit the installed library: its own path runs instead,
    said once per process."""
    if name not in _refused:
        _refused.add(name)
        log.warning("patch %s not used: %s; the library's own path runs instead", name, reason)


def refused() -> frozenset[str]:
    """The patches this process runs without (read by the tests)."""
    return frozenset(_refused)
