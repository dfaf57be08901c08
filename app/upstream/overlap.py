"""The part of an instructed continuation that repeats the answer so far, trimmed. No I/O here.

A continuation asked by an instruction (``instruction``, app/dialects/continuation.py) is a
new answer, not the model's open turn written on: told to go on without repeating, a model
may still start by repeating the end of what it said. The overlap is the longest suffix of
the answer so far that is a prefix of the continuation; it is not relayed, so the caller's
joined text has no repeated part.

What counts as an overlap, and why:

- at least ``MIN_OVERLAP`` characters (8: about two short words), or the whole answer so far
  when it is shorter. A shorter match (a space, a comma, "the") is as likely the model's
  own next words as a repeat, and trimming real words is worse than relaying a short
  repeat; eight characters of the answer's end met again at the continuation's start by
  chance are rare in prose;
- within the answer's last ``WINDOW`` characters: a model that repeats repeats its last
  sentence or so, not pages; the bound keeps the search's cost bounded (each chunk looked at
  while the start is held costs a search of the window).

The continuation's text is held from its first character while it could still be the start
of a longer overlap (it occurs in the answer's end, before its last character), and let go,
trimmed, as soon as it cannot, or at anything else the stream says (a finish, a tool call, a
usage, its end). Then the rest passes as it comes: only a continuation's start is held.
"""

from __future__ import annotations

MIN_OVERLAP = 8
WINDOW = 4096


def overlap(answer: str, continuation: str) -> int:
    """The length of the overlap (see the module) of ``continuation`` with ``answer``: the
    longest suffix of ``answer``'s last WINDOW characters that is a prefix of
    ``continuation``, at least MIN_OVERLAP long or the whole ``answer``; 0 when none is."""
    tail = answer[-WINDOW:]
    for k in range(min(len(tail), len(continuation)), 0, -1):
        if k < MIN_OVERLAP and k != len(answer):
            break
        if tail.endswith(continuation[:k]):
            return k
    return 0


class Trim:
    """A continuation's text, chunk by chunk, without its overlap with ``answer``."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self._tail = answer[-WINDOW:]
        self.held = ""
        self.done = not answer  # nothing said yet: nothing can be repeated

    def feed(self, text: str, end: bool = False) -> str:
        """What of ``text`` goes on now: "" while the start is held; ``end``: nothing more
        may be held (the stream says something else next)."""
        if self.done:
            return text
        self.held += text
        if not end and (not self.held or self.held in self._tail[:-1]):
            return ""  # it may yet be the start of a longer overlap
        self.done = True
        out, self.held = self.held[overlap(self.answer, self.held) :], ""
        return out
