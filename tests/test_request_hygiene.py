"""Request hygiene: bodies the proxy must forward exactly, or answer clearly (issue 10).

Numbers beyond 64 bits, bodies of a shape deepmem does not understand, compressed bodies.
"""

from __future__ import annotations

import json
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from compressors.view import Conversation, Dialect
from proxy.pipeline import Outcome, RequestContext, rewrite_request

HEADERS = {"x-session-id": "hygiene"}


def mark_first_item(conversation: Conversation, context: RequestContext) -> bool:
    """A transform that always changes the body, so the proxy re-serialises it."""
    if not conversation.items:
        return False
    conversation.items[0].set_text("rewritten")
    return True


# --- item 17: integers outside 64 bits keep their exact text -------------------------------

# orjson reads integers from -2**63 to 2**64-1 exactly, anything beyond as a float.
OUTSIDE_64_BITS = st.integers(max_value=-(2**63) - 1) | st.integers(min_value=2**64)


@settings(max_examples=200, deadline=None)
@given(
    top=OUTSIDE_64_BITS,
    in_message=OUTSIDE_64_BITS,
    in_list=st.lists(OUTSIDE_64_BITS | st.integers(), min_size=1, max_size=4),
    spaced=st.booleans(),
)
@example(top=-(2**63) - 1, in_message=2**64, in_list=[-9223372036854775809], spaced=False)
def test_rewritten_body_keeps_the_exact_text_of_integers_beyond_64_bits(
    top: int, in_message: int, in_list: list[int], spaced: bool
) -> None:
    body = {
        "model": "m",
        "seed": top,
        "messages": [
            {"role": "user", "content": "hello", "x_trace": in_message},
            {"role": "assistant", "content": "hi", "x_numbers": in_list},
        ],
    }
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(body, separators=separators).encode()
    rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, HEADERS, [mark_first_item])
    assert rewrite.outcome == Outcome.REWRITTEN
    tokens = re.findall(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", rewrite.body)
    for number in (top, in_message, *in_list):
        assert str(number).encode() in tokens
    forwarded = json.loads(rewrite.body)
    assert forwarded["seed"] == top and isinstance(forwarded["seed"], int)
    assert forwarded["messages"][0]["x_trace"] == in_message
    assert forwarded["messages"][1]["x_numbers"] == in_list
    assert forwarded["messages"][0]["content"] == "rewritten"
