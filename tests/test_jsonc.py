"""The JSONC reader and in-place editor behind ``deepmem init``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonc

COMMENTED = """\
// OpenCode settings
{
  "$schema": "https://opencode.ai/config.json", // a URL is no comment
  /* block
     comment */
  "model": "anthropic/claude-sonnet-4-5",
  "text": "not // a comment, nor /* this */",
  "list": [1, 2.5, -3e2, true, false, null,],
  "nested": { "a": { "b": "\\u00e9\\"" }, },
}
"""


def test_reads_comments_trailing_commas_and_strings_that_look_like_comments() -> None:
    assert jsonc.loads(COMMENTED) == {
        "$schema": "https://opencode.ai/config.json",
        "model": "anthropic/claude-sonnet-4-5",
        "text": "not // a comment, nor /* this */",
        "list": [1, 2.5, -300.0, True, False, None],
        "nested": {"a": {"b": 'é"'}},
    }


def test_a_byte_order_mark_and_comment_markers_inside_strings() -> None:
    text = """\ufeff{
      // a comment with "quotes" and a trailing comma,
      "url": "http://127.0.0.1:8787/v1", /* not // a line comment */
      "escaped": "a \\" // inside",
      "list": [1, 2, /* two */ ],
    }"""
    assert jsonc.loads(text) == {
        "url": "http://127.0.0.1:8787/v1",
        "escaped": 'a " // inside',
        "list": [1, 2],
    }


def test_a_document_of_only_comments_has_no_value() -> None:
    assert jsonc.parse("  // nothing\n/* here */\n") is None


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ('{"a": 1 "b": 2}', "line 1, column 9", "expected ',' or '}'"),
        ('{\n  "a": "open\n}', "line 2, column 8", "string not closed before the end of its"),
        ('{"a": "tab\there"}', "line 1, column 11", "control character"),
        ('{"a": "never closed', "line 1, column 7", "unterminated string"),
        ('{"a": 1} /* open', "line 1, column 10", "unterminated /* comment"),
        ('{"a": 1}\n{"b": 2}', "line 2, column 1", "unexpected text after"),
        ("{a: 1}", "line 1, column 2", "property name in double quotes"),
        ('{"a": tru}', "line 1, column 7", "unexpected character 't'"),
        ('{"a": 01.}', "line 1, column 7", "bad number"),
        ('{"a": "\\x"}', "line 1, column 7", "bad escape"),
        ('{"a": [1, 2}', "line 1, column 12", "expected ',' or ']'"),
        ('{"a": ', "line 1, column 7", "unexpected end of file"),
    ],
)
def test_errors_say_where_and_what(text: str, where: str, what: str) -> None:
    with pytest.raises(jsonc.JsoncError) as caught:
        jsonc.parse(text)
    assert str(caught.value).startswith(where + ": ")
    assert what in str(caught.value)


def test_replacing_a_value_touches_only_its_span() -> None:
    edited = jsonc.set_value(COMMENTED, ["nested", "a", "b"], "http://127.0.0.1:8787/x")
    assert edited == COMMENTED.replace('"\\u00e9\\""', '"http://127.0.0.1:8787/x"')


def test_inserting_follows_the_objects_trailing_comma_habit_and_keeps_line_comments() -> None:
    text = '{\n  "a": 1, // one\n  "b": 2, // two\n}\n'
    edited = jsonc.set_value(text, ["c"], {"d": True})
    assert edited == '{\n  "a": 1, // one\n  "b": 2, // two\n  "c": {\n    "d": true\n  },\n}\n'


def test_inserting_after_a_member_without_comma_adds_one_before_its_comment() -> None:
    text = '{\n\t"a": 1 // one\n}'
    assert jsonc.set_value(text, ["b"], 2) == '{\n\t"a": 1, // one\n\t"b": 2\n}'


def test_single_line_objects_stay_on_one_line() -> None:
    text = '{\n  "options": { "apiKey": "k" },\n  "x": {}\n}'
    edited = jsonc.set_value(text, ["options", "baseURL"], "u")
    edited = jsonc.set_value(edited, ["x", "y"], 1)
    assert (
        edited == '{\n  "options": { "apiKey": "k", "baseURL": "u" },\n  "x": {\n    "y": 1\n  }\n}'
    )
    assert jsonc.set_value('{"a": 1}', ["b", "c"], 2) == '{"a": 1, "b": {"c": 2}}'


def test_empty_root_and_objects_holding_only_comments() -> None:
    assert jsonc.set_value("{}", ["a"], 1) == '{\n  "a": 1\n}'
    text = '{\n  "mcp": {\n    // none yet\n  }\n}'
    assert jsonc.set_value(text, ["mcp", "x"], 1) == (
        '{\n  "mcp": {\n    "x": 1\n    // none yet\n  }\n}'
    )


def test_crlf_line_endings_are_kept() -> None:
    text = '{\r\n  "a": 1 // one\r\n}\r\n'
    edited = jsonc.set_value(text, ["b", "c"], "d")
    assert edited == '{\r\n  "a": 1, // one\r\n  "b": {\r\n    "c": "d"\r\n  }\r\n}\r\n'


def test_duplicate_keys_edit_the_one_that_counts() -> None:
    text = '{"a": 1, "a": 2}'
    assert jsonc.set_value(text, ["a"], 3) == '{"a": 1, "a": 3}'
    assert jsonc.loads(text) == {"a": 2}


def test_a_step_that_is_not_an_object_is_an_error() -> None:
    with pytest.raises(jsonc.JsoncError, match=r"line 1, column 14: provider is not an object"):
        jsonc.set_value('{"provider": [1]}', ["provider", "x"], 1)
    with pytest.raises(jsonc.JsoncError, match="top level is not an object"):
        jsonc.set_value("[1]", ["x"], 1)
    with pytest.raises(jsonc.JsoncError, match="no JSON object"):
        jsonc.set_value("// empty\n", ["x"], 1)


# ---- any document, any path: the edit does exactly what it says and nothing else

keys = st.sampled_from(["a", "b", "provider", "options", "baseURL", "x y", "é", "//", "/*"])
scalars = st.one_of(
    st.integers(-5, 5), st.booleans(), st.none(), st.text(alphabet='ab/*"\\é \n', max_size=6)
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=3)),
    max_leaves=8,
)
documents = st.dictionaries(keys, values, max_size=4)


def _render(data: Any, layout: int, comments: bool) -> str:
    text = json.dumps(data, indent=layout or None)
    if comments:
        text = "// head /* \n" + text.replace(",\n", ', // tail, "x"\n') + "\n/* end */\n"
    return text


def _expected(data: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    result = json.loads(json.dumps(data))
    node = result
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return result


@settings(max_examples=300, deadline=None)
@given(
    documents,
    st.lists(keys, min_size=1, max_size=3),
    values,
    st.sampled_from([0, 2, 4]),
    st.booleans(),
)
def test_set_value_changes_exactly_the_path(
    data: dict[str, Any], path: list[str], value: Any, layout: int, comments: bool
) -> None:
    text = _render(data, layout, comments)
    blocked = _blocked(data, path)
    if blocked:
        with pytest.raises(jsonc.JsoncError):
            jsonc.set_value(text, path, value)
        return
    edited = jsonc.set_value(text, path, value)
    assert jsonc.loads(edited) == _expected(data, path, value)
    if comments:  # every comment survives, but those inside a value that was replaced
        replaced = _span(text, path)
        assert edited.count("// tail") == text.count("// tail") - replaced.count("// tail")
        assert edited.startswith("// head /* \n") and edited.endswith("\n/* end */\n")
    assert jsonc.set_value(edited, path, value) == edited  # a second edit changes nothing


def _span(text: str, path: list[str]) -> str:
    node = jsonc.parse(text)
    for key in path:
        member = node.member(key) if node is not None and node.kind == "object" else None
        if member is None:
            return ""
        node = member.value
    return "" if node is None else text[node.start : node.end]


def _blocked(data: Any, path: list[str]) -> bool:
    node = data
    for key in path[:-1]:
        if key not in node:
            return False
        node = node[key]
        if not isinstance(node, dict):
            return True
    return False
