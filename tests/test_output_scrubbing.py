"""What a worker process's code writes to stdout/stderr is scrubbed, in whatever pieces."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_scrubbing import SECRETS

from toolfleet.worker.registry.redaction import Redactor
from toolfleet.worker.registry.scrubbed_streams import MAX_PENDING, ScrubbingStream


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    secret=SECRETS,
    cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=50),
    filler=st.integers(min_value=0, max_value=MAX_PENDING + 100),
)
def test_printed_secret_is_scrubbed_in_whatever_pieces_it_is_written(
    secret: str, cuts: list[int], filler: int
) -> None:
    """A secret written to a scrubbing stream in pieces, across a line break of its own or
    after a long line without one, comes out redacted and the rest of the text unchanged."""
    assume(secret.strip() == secret and len(secret) >= 8)
    text = f"=={secret}==\n{'=' * filler}{secret}\n=={secret}"
    out = io.StringIO()
    stream = ScrubbingStream(out, Redactor({secret}))
    start = 0
    while start < len(text):
        size = cuts[start % len(cuts)]
        stream.write(text[start : start + size])
        start += size
    stream.flush()
    assert out.getvalue() == f"==[redacted]==\n{'=' * filler}[redacted]\n==[redacted]"


def test_a_scrubbed_line_goes_out_at_its_line_break() -> None:
    """A complete line is written, scrubbed, as soon as its line break is; the rest waits."""
    out = io.StringIO()
    stream = ScrubbingStream(out, Redactor({"sk-0123456789"}))
    stream.write("key sk-01234")
    assert out.getvalue() == ""
    stream.write("56789\nnext")
    assert out.getvalue() == "key [redacted]\n"
    stream.flush()
    assert out.getvalue() == "key [redacted]\nnext"


def test_a_stream_without_secrets_passes_text_through() -> None:
    """With no secret known, a scrubbing stream writes each piece as it comes."""
    out = io.StringIO()
    stream = ScrubbingStream(out, Redactor())
    stream.write("no line break yet")
    assert out.getvalue() == "no line break yet"
