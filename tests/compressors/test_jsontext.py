"""compressors/jsontext.py: integers of any size survive a parse and a serialisation."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from compressors import jsontext

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


@given(values, st.sampled_from([(",", ":"), (", ", ": "), (" ,\n ", " :\t")]), st.booleans())
def test_integers_of_any_size_keep_their_value(value, separators, indent):
    raw = json.dumps(value, separators=separators, indent=2 if indent else None).encode()
    parsed, _ = jsontext.loads(raw)
    assert json.loads(jsontext.dumps(parsed)) == json.loads(raw)


def test_only_integer_tokens_beyond_64_bits_need_the_exact_parser():
    assert jsontext.has_huge_integer(b'{"seed": -9223372036854775809}')
    assert jsontext.has_huge_integer(b"[\n  18446744073709551616\n]")
    assert not jsontext.has_huge_integer(b'{"id": "12345678901234567890"}')  # a string
    assert not jsontext.has_huge_integer(b'{"n": 1234567890123456789}')  # fits
    assert not jsontext.has_huge_integer(b'{"x": 123456789012345678901.5}')  # a float
    # Regression: a document that is nothing but the integer was read as a float.
    assert jsontext.has_huge_integer(b"-9223372036854775809")
    assert jsontext.has_huge_integer(b" 18446744073709551616\n")
    assert not jsontext.has_huge_integer(b'"18446744073709551616"')
