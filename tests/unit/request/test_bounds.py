"""The most a call can be billed (app/request/bounds.py) and what it costs (app/tenancy/prices.py).

The prompt bound is checked against what it must stay above: the UTF-8 bytes of every text
the body carries (no tokenizer makes more tokens than bytes), whatever JSON spelling the
caller used; images count a fixed charge, never their data.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.request import bounds, routes
from app.request.bounds import IMAGE_TOKENS, PROMPT_OVERHEAD, choices, output_bound, prompt_bound
from app.request.usage import Usage
from app.tenancy import prices
from app.tenancy.prices import Price, PriceTable
from app.upstream import catalog as upstreams
from tests.support.strategies import utf8_text

texts = utf8_text(max_size=200)


def _raw(body: dict, **dumps) -> int:
    return len(json.dumps(body, **dumps).encode())


@given(st.lists(texts, min_size=1, max_size=6), st.booleans())
def test_the_prompt_bound_is_above_the_bytes_of_every_text(parts: list[str], ascii_: bool) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": p} for p in parts]}
    text_bytes = sum(len(p.encode()) for p in parts)
    for size in (_raw(body, ensure_ascii=ascii_), _raw(body, separators=(",", ":"))):
        assert prompt_bound(size, body) >= text_bytes + PROMPT_OVERHEAD


def test_an_image_counts_its_charge_not_its_data() -> None:
    data = "data:image/png;base64," + "A" * 100_000
    image = {"type": "image_url", "image_url": {"url": data, "detail": "high"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    size = _raw(body)
    bound = prompt_bound(size, body)
    assert bound < 20_000  # not the 100 KB of base64
    assert bound >= IMAGE_TOKENS + len("hi") + PROMPT_OVERHEAD
    # Two images by URL (Responses' input_image too): two charges, the URL bytes taken out.
    url = {"type": "input_image", "image_url": "https://example.com/cat.png"}
    body = {"input": [{"role": "user", "content": [url, url]}]}
    assert prompt_bound(_raw(body), body) == (
        _raw(body) - 2 * len("typeinput_imageimage_urlhttps://example.com/cat.png")
        + 2 * IMAGE_TOKENS + PROMPT_OVERHEAD
    )  # fmt: skip


def test_an_escaped_image_never_takes_out_more_than_the_body_holds() -> None:
    image = {"type": "image_url", "image_url": {"url": "é" * 50}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    escaped = _raw(body)  # "\u00e9": six bytes each in the body, two in the image's text
    assert prompt_bound(escaped, body) >= escaped - (50 * 2 + 30) + IMAGE_TOKENS


def test_the_output_bound_is_the_calls_own_else_the_ceiling_times_its_answers() -> None:
    assert output_bound(routes.CHAT, {"max_tokens": 50, "n": 3}, 999) == 150
    assert output_bound(routes.CHAT, {"max_completion_tokens": 70}, 999) == 70
    assert output_bound(routes.RESPONSES, {"max_output_tokens": 7}, 999) == 7
    assert output_bound(routes.CHAT, {"messages": []}, 999) == 999
    assert output_bound(routes.CHAT, {"max_tokens": True}, 999) == 999  # a bool is not a count
    assert output_bound(routes.COMPLETIONS, {"max_tokens": 10, "n": 2, "best_of": 5}, 0) == 50
    assert output_bound(routes.CHAT, {"max_tokens": 10, "best_of": 5}, 0) == 10  # chat has none
    assert output_bound(routes.EMBEDDINGS, {"max_tokens": 10}, 999) == 0
    assert choices(routes.CHAT, {"n": 0}) == 1 and choices(routes.CHAT, {"n": "2"}) == 1


# -- prices ----------------------------------------------------------------------------------
TABLE = """
[[upstreams]]
name = "a"
base_url = "http://127.0.0.1:9/v1"

[prices]
version = "2026-12-01"
[prices.models."gpt-4o-mini"]
input = 0.15
cached_input = 0.075
output = 0.6
max_output_tokens = 16384
[prices.models."*"]
input = 1.000001
output = 2
"""


def test_the_price_table_loads_exactly_and_prices_any_model_by_star() -> None:
    table = upstreams.prices_of(TABLE)
    assert table is not None and table.version == "2026-12-01"
    mini = table.price_of("gpt-4o-mini")
    assert mini == Price(
        input=150_000, cached_input=75_000, output=600_000, max_output_tokens=16384
    )
    other = table.price_of("anything-else")
    assert other == Price(input=1_000_001, cached_input=1_000_001, output=2_000_000)
    assert upstreams.prices_of(TABLE.split("[prices]")[0]) is None
    assert len(upstreams.load(TABLE, {})) == 1  # the upstreams file accepts [prices]


def test_a_usage_costs_its_prompt_cached_prompt_and_output_at_their_rates() -> None:
    price = Price(input=150_000, cached_input=75_000, output=600_000)
    chat = {"prompt_tokens": 1000, "completion_tokens": 200,
            "prompt_tokens_details": {"cached_tokens": 400}}  # fmt: skip
    assert price.cost(Usage(chat)) == 600 * 150_000 + 400 * 75_000 + 200 * 600_000
    responses = {"input_tokens": 10, "output_tokens": 5, "input_tokens_details": {}}
    assert price.cost(Usage(responses)) == 10 * 150_000 + 5 * 600_000
    cached = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 9}}
    assert price.cost(Usage(cached)) == 3 * 75_000  # never more cached than prompt
    assert price.cost(Usage({"prompt_tokens": True, "completion_tokens": -4})) == 0
    assert price.bound(10, 5) == 10 * 150_000 + 5 * 600_000
    assert Price(input=1, cached_input=9, output=0).bound(10, 0) == 90  # the dearer rate
    assert prices.usd(1_500_000_000_000) == 1.5 and prices.to_pico(0.01) == 10**10


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ("[prices]\n[prices.models.m]\ninput = 1\noutput = 1", "prices.version"),
        ('[prices]\nversion = "v"', "prices.models"),
        ('[prices]\nversion = "v"\n[prices.models.m]\noutput = 1', "input is missing"),
        ('[prices]\nversion = "v"\n[prices.models.m]\ninput = 1\noutput = 1\nfoo = 2', "foo"),
        ('[prices]\nversion = "v"\n[prices.models.m]\ninput = -1\noutput = 1', ">= 0"),
        ('[prices]\nversion = "v"\n[prices.models.m]\ninput = 0.0000001\noutput = 1', "6 dec"),
        ('[prices]\nversion = "v"\n[prices.models.m]\ninput = nan\noutput = 1', "finite"),
        ('[prices]\nversion = "v"\n[prices.models.m]\ninput = "1"\noutput = 1', "number"),
        ('[prices]\nversion = "v"\nextra = 1\n[prices.models.m]\ninput = 1\noutput = 1', "extra"),
        (
            '[prices]\nversion = "v"\n[prices.models.m]\ninput = 1\noutput = 1\n'
            "max_output_tokens = -5",
            "max_output_tokens",
        ),
    ],
)
def test_a_wrong_price_table_is_refused_naming_the_field(table: str, complaint: str) -> None:
    text = '[[upstreams]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\n\n' + table
    with pytest.raises(upstreams.ConfigError, match=complaint):
        upstreams.load(text, {}, path="conf.toml")


def test_an_unpriced_model_has_no_price_without_a_star() -> None:
    table = PriceTable("v", {"m": Price(1, 1, 1)})
    assert table.price_of("m") == Price(1, 1, 1)
    assert table.price_of("x") is None and table.price_of(None) is None


def test_each_generating_route_has_an_output_field_among_the_bounds() -> None:
    generating = {route for route in routes.ROUTES if route.generates}
    assert generating == {route for route in routes.ROUTES if route.output_field}
    assert {route.output_field for route in generating} <= set(bounds.MAX_TOKEN_FIELDS)


_PARTS = st.one_of(
    texts.map(lambda t: {"type": "text", "text": t}),
    texts.map(lambda t: {"type": "image_url", "image_url": {"url": t}}),
    texts.map(lambda t: {"type": "input_image", "image_url": t}),
    texts.map(lambda t: {"type": "image", "source": {"data": t}}),
)


@given(st.lists(st.lists(_PARTS, max_size=4), min_size=1, max_size=4), st.booleans(),
       st.booleans())  # fmt: skip
def test_the_raw_bytes_skip_the_walk_only_where_no_image_can_be(
    messages: list[list[dict]], ascii_: bool, escape: bool
) -> None:
    """With the bytes a body came from, the bound is the walk's own, however the caller
    spelled the image types: ``\\u``-escaped letters included."""
    body = {"model": "m", "messages": [{"role": "user", "content": c} for c in messages]}
    raw = json.dumps(body, ensure_ascii=ascii_).encode()
    if escape:  # "image" spelled with an escape, as JSON allows: the parsed body is the same
        raw = raw.replace(b'"image', b'"\\u0069mage').replace(b'_image"', b'_\\u0069mage"')
        assert json.loads(raw) == body
    assert prompt_bound(len(raw), body, raw) == prompt_bound(len(raw), body)


def test_a_body_with_no_image_is_not_walked(monkeypatch) -> None:
    walked: list[dict] = []

    def walk(body: dict) -> tuple[int, int]:
        walked.append(body)
        return 0, 0

    monkeypatch.setattr(bounds, "_images", walk)
    body = {"model": "m", "messages": [{"role": "user", "content": "a picture of a cat"}]}
    raw = json.dumps(body).encode()
    assert prompt_bound(len(raw), body, raw) == len(raw) + PROMPT_OVERHEAD
    assert walked == []
    prompt_bound(len(raw), body)  # without the bytes: walked
    assert walked == [body]
