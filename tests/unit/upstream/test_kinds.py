"""Upstreams of other kinds: the file's ``kind`` and ``max_tokens``, which routes each kind
serves, the caller's credential re-spelt for the upstream's header, and the translated answer
read through ``Translated`` (app/upstream/translation.py). No sockets: a fake urllib3 answer."""

from __future__ import annotations

import itertools

import pytest

from app.core.errors import ModelNotServed, UpstreamReset
from app.dialects import anthropic_door, gemini
from app.request import routes
from app.upstream import catalog
from app.upstream.attempts import Attempts
from app.upstream.catalog import ConfigError, UpstreamSpec, load
from app.upstream.spans import upstream_attributes
from app.upstream.translation import Chained, Translated, _respelt, translation_for
from tests.conftest import ROOT
from tests.support.fake_raw import PieceRaw

ANTHROPIC = """
[[upstreams]]
name = "claude"
base_url = "https://api.anthropic.com/v1"
kind = "anthropic"
key = "sk-ant"
max_tokens = 8192
"""


def test_kind_sets_the_key_header_and_max_tokens() -> None:
    (spec,) = load(ANTHROPIC, {})
    assert (spec.kind, spec.auth, spec.max_tokens) == ("anthropic", "x-api-key", 8192)
    gemini = ANTHROPIC.replace('"anthropic"', '"gemini"').replace("max_tokens = 8192\n", "")
    (spec,) = load(gemini, {})
    assert (spec.kind, spec.auth, spec.max_tokens) == ("gemini", "x-goog-api-key", 4096)
    (spec,) = load(ANTHROPIC.replace('kind = "anthropic"\n', ""), {})
    assert (spec.kind, spec.auth) == ("openai", "bearer")


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ('kind = "cohere"', "upstreams.kind must be one of openai, anthropic, gemini"),
        ("max_tokens = 0", "upstreams.max_tokens must be >= 1"),
        ('max_tokens = "many"', "upstreams.max_tokens"),
    ],
)
def test_a_wrong_kind_or_bound_is_refused_with_its_line(edit: str, says: str) -> None:
    field = edit.split(" ")[0]
    lines = [edit if line.startswith(field) else line for line in ANTHROPIC.splitlines()]
    with pytest.raises(ConfigError, match=says):
        load("\n".join(lines), {})


def test_each_kind_serves_its_routes() -> None:
    openai, claude, gemini = (
        UpstreamSpec(kind, "https://x/v1", kind=kind) for kind in ("openai", "anthropic", "gemini")
    )
    for route, path in [("chat", "/chat/completions"), ("messages", "/messages")]:
        assert all(s.speaks(routes.of_name(route), path) for s in (openai, claude, gemini))
    for route, path in [("embeddings", "/embeddings"), ("passthrough", "/models")]:
        assert openai.speaks(routes.of_name(route), path)
        assert not claude.speaks(routes.of_name(route), path)
        assert not gemini.speaks(routes.of_name(route), path)
    assert claude.speaks(routes.COUNT_TOKENS, "/messages/count_tokens")
    assert not openai.speaks(routes.COUNT_TOKENS, "/messages/count_tokens")
    assert not gemini.speaks(routes.COUNT_TOKENS, "/messages/count_tokens")
    assert claude.speaks(routes.PASSTHROUGH, "/messages/batches")


def test_a_model_served_only_by_another_kind_is_a_clear_404_on_other_routes() -> None:
    specs = [UpstreamSpec("claude", "https://x/v1", kind="anthropic", models=("claude-x",))]
    attempts = Attempts.__new__(Attempts)
    attempts.specs = specs
    attempts.check_serves("claude-x", routes.CHAT, "/chat/completions")  # served
    with pytest.raises(ModelNotServed, match=r"\(anthropic\) do not serve /v1/embeddings"):
        attempts.check_serves("claude-x", routes.EMBEDDINGS, "/embeddings")
    with pytest.raises(ModelNotServed, match="No upstream serves the model 'gpt-x'"):
        attempts.check_serves("gpt-x", routes.CHAT, "/chat/completions")


def test_the_404_names_the_kinds_that_serve_the_route() -> None:
    """Not "only OpenAI-compatible upstreams serve every route" for count_tokens, which only
    Anthropic ones serve."""
    attempts = Attempts.__new__(Attempts)
    attempts.specs = [UpstreamSpec("o", "https://x/v1", models=("gpt-x",))]
    with pytest.raises(ModelNotServed) as caught:
        attempts.check_serves("gpt-x", routes.COUNT_TOKENS, "/messages/count_tokens")
    assert caught.value.message == (
        "The upstreams that serve 'gpt-x' (openai) do not serve /v1/messages/count_tokens: "
        "only Anthropic upstreams serve it."
    )
    attempts.specs = [UpstreamSpec("g", "https://x/v1", kind="gemini")]
    with pytest.raises(ModelNotServed) as caught:
        attempts.check_serves(None, routes.PASSTHROUGH, "/messages/batches")
    assert caught.value.message == (
        "The upstreams (gemini) do not serve /v1/messages/batches: only OpenAI-compatible "
        "and Anthropic upstreams serve it."
    )
    with pytest.raises(ModelNotServed) as caught:
        attempts.check_serves(None, routes.EMBEDDINGS, "/embeddings")
    assert caught.value.message == (
        "The upstreams (gemini) do not serve /v1/embeddings: only OpenAI-compatible "
        "upstreams serve it; Anthropic and Gemini ones serve chat and messages."
    )


def test_candidates_leave_out_the_kinds_that_do_not_speak_the_route() -> None:
    specs = [UpstreamSpec(k, "https://x/v1", kind=k) for k in ("openai", "anthropic", "gemini")]
    speaking = [s for s in specs if s.speaks(routes.EMBEDDINGS, "/embeddings")]
    order = catalog.candidates(speaking, "m", allowed=lambda _: True, rand=lambda: 0.0)
    assert [s.name for s in order] == ["openai"]


def test_no_translation_between_the_same_dialects() -> None:
    assert translation_for("openai", routes.CHAT) is None
    assert translation_for("anthropic", routes.MESSAGES) is None
    assert translation_for("anthropic", routes.COUNT_TOKENS) is None
    assert translation_for("openai", routes.EMBEDDINGS) is None
    assert translation_for("anthropic", routes.CHAT) is not None
    assert translation_for("openai", routes.MESSAGES) is not None
    assert translation_for("gemini", routes.MESSAGES) is not None


def test_the_callers_credential_moves_to_the_upstreams_header() -> None:
    given = {"Authorization": "Bearer sk-caller", "Content-Length": "12", "X-Trace": "t"}
    assert _respelt(given, "x-api-key") == {"x-api-key": "sk-caller", "X-Trace": "t"}
    assert _respelt(given, "x-goog-api-key") == {"x-goog-api-key": "sk-caller", "X-Trace": "t"}
    anthropic_sdk = {"x-api-key": "sk-caller", "anthropic-version": "2023-06-01"}
    assert _respelt(anthropic_sdk, "bearer") == {
        "anthropic-version": "2023-06-01",
        "Authorization": "Bearer sk-caller",
    }
    assert _respelt({"X-Trace": "t"}, "x-api-key") == {"X-Trace": "t"}  # none brought


class Upper:
    """A translator that holds bytes until a blank line ends an event, then gives it upper
    cased; at the end, a last word."""

    def __init__(self) -> None:
        self.held = b""

    def feed(self, data: bytes) -> bytes:
        self.held += data
        done, sep, self.held = self.held.rpartition(b"\n\n")
        return (done + sep).upper()

    def close(self) -> bytes:
        return b"END\n\n"

    usage_reported = False  # it writes no usage


def test_a_translated_stream_reads_on_until_an_event_is_whole_and_ends_with_close() -> None:
    raw = PieceRaw([b"a", b"b\n", b"\nc", b"\n\n"])
    translated = Translated(raw, 200, raw.headers, stream=Upper(), limit=100)
    assert translated.read1() == b"AB\n\n"  # three reads of the upstream, one of ours
    assert translated.read1() == b"C\n\n"
    assert translated.read1() == b"END\n\n"
    assert translated.read1() == b""  # the end, once
    translated.release_conn()
    assert raw.released


def test_a_whole_answer_is_translated_once_at_its_end_and_bounded() -> None:
    raw = PieceRaw([b'{"a":', b"1}"])
    whole = Translated(raw, 200, raw.headers, whole=lambda b: b"<" + b + b">", limit=100)
    assert (whole.read1(), whole.read1()) == (b'<{"a":1}>', b"")
    raw = PieceRaw([b"x" * 60, b"y" * 60])
    big = Translated(raw, 200, raw.headers, whole=lambda b: b, limit=100)
    with pytest.raises(UpstreamReset, match="exceeds 100 bytes"):
        big.read1()


def _gemini_chunk(text: str, usage: bool) -> bytes:
    meta = ',"usageMetadata":{"promptTokenCount":5,"candidatesTokenCount":2}' if usage else ""
    return (
        b'data: {"candidates":[{"content":{"parts":[{"text":"' + text.encode() + b'"}],'
        b'"role":"model"},"finishReason":"STOP","index":0}]' + meta.encode() + b"}\r\n\r\n"
    )


@pytest.mark.parametrize("usage", [True, False])
def test_a_translated_stream_says_whether_its_usage_is_the_providers(usage: bool) -> None:
    """Gemini through the Anthropic door (two translators chained, as translation.py chains
    them): the usage is Gemini's own only when Gemini sent one; a whole answer says None."""
    door = anthropic_door.ChatToStream(message_id="msg_1", model="m", input_tokens=3)
    first = gemini.StreamToChat(include_usage=True, created=1, fallback_id="f")
    raw = PieceRaw([_gemini_chunk("Hi", usage)])
    translated = Translated(raw, 200, raw.headers, stream=Chained(first, door), limit=10_000)
    assert translated.usage_reported is False
    out = translated.read()
    assert out.endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert (translated.usage_reported, first.usage_reported, door.usage_reported) == (
        usage, usage, usage
    )  # fmt: skip
    whole = Translated(PieceRaw([b"{}"]), 200, raw.headers, whole=lambda b: b, limit=100)
    assert whole.usage_reported is None


def test_a_chain_reports_the_providers_usage_only_when_both_links_do() -> None:
    class Link(Upper):
        def __init__(self, reported: bool) -> None:
            super().__init__()
            self.usage_reported = reported

    for a, b in itertools.product([True, False], repeat=2):
        assert Chained(Link(a), Link(b)).usage_reported is (a and b)


def test_a_span_names_the_provider_by_the_upstreams_kind() -> None:
    def provider(kind: str = "openai", auth: str = "bearer") -> object:
        spec = UpstreamSpec("u", "https://x/v1", kind=kind, auth=auth)
        return upstream_attributes(spec)["gen_ai.provider.name"]

    assert provider(kind="anthropic", auth="x-api-key") == "anthropic"
    assert provider(kind="gemini") == "gcp.gemini"
    assert provider() == "openai"
    assert provider(auth="api-key") == "azure.ai.openai"


def test_the_shipped_examples_other_providers_load_once_uncommented() -> None:
    """deploy/llmgate.example.toml's commented Anthropic and Gemini upstreams, uncommented as
    its comment says, are a valid upstreams file (their keys' variables set)."""
    text = (ROOT / "deploy" / "llmgate.example.toml").read_text()
    start = text.index('# [[upstreams]]\n# name = "claude"')
    block = text[start : text.index("\n\n", start)]
    uncommented = "\n".join(line.removeprefix("#").removeprefix(" ") for line in block.splitlines())
    env = {"ANTHROPIC_API_KEY": "sk-ant", "GEMINI_API_KEY": "g"}
    claude, gemini = load(uncommented, env)
    assert (claude.kind, claude.key, claude.max_tokens) == ("anthropic", "sk-ant", 8192)
    assert (gemini.kind, gemini.auth) == ("gemini", "x-goog-api-key")
