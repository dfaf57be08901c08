"""The docs say which of their code blocks are examples to run (tests/support/doc_examples.py);
tests/integration/test_doc_examples.py runs those against `make run`'s gateway."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.support.doc_examples import EXAMPLE_DOCS, parse

SAMPLE = """\
# Title

<!-- example: run -->
```sh
curl -N http://127.0.0.1:8080/v1/models
```

<!-- example: not run: needs a provider's key -->

````python
print("```")  # in a longer fence
````

```
a diagram: no language, never run
```

~~~bash
echo unmarked
~~~

<!-- example: maybe -->
```py
pass
```

<!-- example: run -->
Some prose: this mark has no block.

<!-- example: run -->
```text
not a language a reader runs
```

<!-- example: run -->
"""


def test_sample_blocks_and_their_marks() -> None:
    parsed = parse(SAMPLE, "S.md")
    found = [(b.line, b.lang, b.mark, b.text) for b in parsed.blocks]
    assert found == [
        (4, "sh", "run", "curl -N http://127.0.0.1:8080/v1/models\n"),
        (10, "python", "not run: needs a provider's key", 'print("```")  # in a longer fence\n'),
        (14, "", None, "a diagram: no language, never run\n"),
        (18, "bash", None, "echo unmarked\n"),
        (23, "py", "maybe", "pass\n"),
        (31, "text", "run", "not a language a reader runs\n"),
    ]  # fmt: skip
    assert [b.runs for b in parsed.blocks] == [True, False, False, False, False, True]
    assert parsed.problems == [
        "S.md:18: a bash block without <!-- example: ... -->",
        "S.md:23: mark 'maybe': `run` or `not run: <why>`",
        "S.md:27: the mark is not followed by a code block",
        "S.md:31: marked run, but text is not run",
        "S.md:35: the mark is not followed by a code block",
    ]


def test_a_reason_is_required_and_an_unclosed_block_runs_to_the_end() -> None:
    parsed = parse("<!-- example: not run -->\n```sh\nmake run\n", "S.md")
    assert parsed.problems == ["S.md:2: mark 'not run': `run` or `not run: <why>`"]
    assert parsed.blocks[0].text == "make run\n"


def test_every_runnable_block_in_the_docs_says_whether_it_runs() -> None:
    for doc in EXAMPLE_DOCS:
        parsed = parse((ROOT / doc).read_text(), doc)
        assert parsed.problems == [], "\n".join(parsed.problems)
        assert any(b.runs for b in parsed.blocks), doc


def test_the_readme_curl_stream_and_sdk_snippet_are_examples_to_run() -> None:
    readme = parse((ROOT / "README.md").read_text(), "README.md").blocks
    assert any(b.runs and b.lang == "sh" and "curl -N" in b.text for b in readme)
    assert any(b.runs and b.lang == "python" and "from openai import" in b.text for b in readme)
