"""The simulator's prompt cache (simulator/prompt_cache.py): automatic caching in 128-word
steps from the minimum, explicit caching up to the marked blocks with its writes reported,
lifetimes renewed by a read, one cache per account; a Messages prompt's words as the
simulator counts them."""

from __future__ import annotations

from simulator import text
from simulator.prompt_cache import HOUR_S, Prompt, PromptCache, Use, anthropic, automatic

MIN, TTL = 1024, 300.0


def _words(n: int, seed: str = "w") -> str:
    return " ".join(f"{seed}{i}" for i in range(n))


def test_automatic_caching_reads_the_longest_stored_prefix_in_steps_of_128() -> None:
    cache = PromptCache()
    first = automatic(_words(2000))
    assert cache.use("g", first, 0.0, MIN, TTL) == Use(0, 0, 0, 2000)
    assert cache.use("g", first, 1.0, MIN, TTL) == Use(1920, 0, 0, 80)
    grown = automatic(_words(2000) + " " + _words(700, "x"))  # the next turn, 2,700 words
    assert cache.use("g", grown, 2.0, MIN, TTL) == Use(1920, 0, 0, 780)
    assert cache.use("g", grown, 3.0, MIN, TTL).read == 2688
    other = automatic(_words(2000, "v"))  # another prefix from its first word
    assert cache.use("g", other, 4.0, MIN, TTL).read == 0
    assert cache.use("another account", first, 5.0, MIN, TTL).read == 0
    short = automatic(_words(1000))
    for now in (6.0, 7.0):
        assert cache.use("g", short, now, MIN, TTL).read == 0  # below the minimum: never kept


def test_an_entry_lives_its_lifetime_from_its_last_use() -> None:
    cache = PromptCache()
    prompt = automatic(_words(1100))
    cache.use("g", prompt, 0.0, MIN, TTL)
    assert cache.use("g", prompt, 299.0, MIN, TTL).read == 1024  # renewed until 599
    assert cache.use("g", prompt, 598.0, MIN, TTL).read == 1024
    assert cache.use("g", prompt, 898.5, MIN, TTL).read == 0  # 300 s after its last read


def _turns(n: int, marks: bool = True, ttl: str | None = None) -> tuple[object, list[object]]:
    mark: dict[str, str] = {"type": "ephemeral"} | ({"ttl": ttl} if ttl else {})
    system = [
        {"type": "text", "text": _words(1500, "s")} | ({"cache_control": mark} if marks else {})
    ]
    messages: list[object] = [{"role": "user", "content": _words(300, "u")}]
    for i in range(n):
        answer: dict[str, object] = {"type": "text", "text": _words(50, f"a{i}")}
        messages.append({"role": "assistant", "content": [answer]})
        result = {"type": "tool_result", "tool_use_id": "t", "content": _words(200, f"r{i}")}
        messages.append({"role": "user", "content": [result]})
    for turn in messages[:-1]:  # the newest is unmarked; the one before it is marked
        for block in turn["content"] if isinstance(turn["content"], list) else []:  # type: ignore[index]
            block.pop("cache_control", None)
    if marks and n:
        messages[-2]["content"][-1]["cache_control"] = mark  # type: ignore[index]
    return system, messages


def test_explicit_caching_reads_at_a_block_boundary_and_writes_to_the_last_mark() -> None:
    cache = PromptCache()
    system, messages = _turns(1)
    first = anthropic(system, messages)
    # 1,500 system words, 300, 50 (marked), 200: written up to the mark, the rest uncached.
    assert cache.use("g", first, 0.0, MIN, TTL) == Use(0, 1850, 0, 2050)
    system, messages = _turns(2)
    second = anthropic(system, messages)
    use = cache.use("g", second, 1.0, MIN, TTL)
    # Read up to the first turn's mark; written: its tool result and the second answer.
    assert use == Use(1850, 250, 0, 450) and use.uncached == 200
    # A read renews what it read, a block boundary of this prompt though no mark of it.
    cache = PromptCache()
    cache.use("g", first, 0.0, MIN, TTL)
    assert cache.use("g", second, 200.0, MIN, TTL).read == 1850
    assert cache.use("g", first, 450.0, MIN, TTL).read == 1850  # kept until 500, not 300
    # Without marks Anthropic stores nothing and reads nothing.
    assert cache.use("h", anthropic(*_turns(2, marks=False)), 2.0, MIN, TTL) == Use(0, 0, 0, 2300)
    assert cache.use("h", anthropic(*_turns(2, marks=False)), 3.0, MIN, TTL).read == 0


def test_a_mark_below_the_minimum_stores_nothing_and_an_hours_mark_lives_an_hour() -> None:
    cache = PromptCache()
    short = anthropic([{"type": "text", "text": _words(500), "cache_control": {"type": "x"}}], [])
    assert cache.use("g", short, 0.0, MIN, TTL) == Use(0, 0, 0, 500)
    assert cache.use("g", short, 1.0, MIN, TTL).read == 0
    hour = anthropic(*_turns(1, ttl="1h"))
    assert cache.use("g", hour, 0.0, MIN, TTL) == Use(0, 1850, 1850, 2050)
    assert cache.use("g", hour, HOUR_S - 1, MIN, TTL).read == 1850


def test_a_messages_prompts_words_are_the_ones_the_simulator_counts() -> None:
    system, messages = _turns(3)
    prompt = anthropic(system, messages)
    assert " ".join(prompt.words) == " ".join(text.messages_prompt(system, messages).split())
    assert prompt.ends[-1] == len(prompt.words) and prompt.marks is not None
    plain = anthropic("be brief", [{"role": "user", "content": "hi there"}])
    assert plain == Prompt(("be", "brief", "hi", "there"), (), (2, 4))
