"""What the session is about: words of the task, used to keep the lines that matter to it.

The focus is drawn from the session's head (the first user message), which never changes, so
a compression that uses it stays a pure function of the output and the session: the same
bytes in every later request, with or without the memo.

Words are compared as lowercase parts, plurals folded: ``get_named_query``,
``getNamedQuery`` and "named queries" all share ``named`` and ``query``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
MIN_LENGTH = 4
MAX_TERMS = 400

# Words too common in prose or code to say what a task is about.
_COMMON_WORDS = """
about above after again also although always another anything around because been before
being below between both cannot could does doing done down during each either else even
every example expected following from further have having here however into itself just
like make makes many might more most much must need needs never none only other otherwise
over please same should since some something still such than that their them then there
these they thing things this those though through under until upon very want were what
when where whether which while will with within without would your yours
true false null self class return import def function const type value values
file files line lines code test tests error errors issue issues change changes changed
repository description directory current working following steps step first second make
sure think minimal edit edits script python run running reproduce confirm fix fixed
"""
COMMON = frozenset(_COMMON_WORDS.split())


def _fold(part: str) -> str:
    """Plural to singular, roughly: ``queries`` → ``query``, ``groups`` → ``group``."""
    if len(part) > MIN_LENGTH and part.endswith("s") and not part.endswith("ss"):
        return part[:-3] + "y" if part.endswith("ies") else part[:-1]
    return part


def word_parts(text: str) -> Iterable[str]:
    """Lowercase parts of every identifier-like word, plural ``s`` folded."""
    for word in _WORD.findall(text):
        lowered = word.lower()
        if len(lowered) >= MIN_LENGTH:
            yield _fold(lowered)
        if "_" in word or not (word.islower() or word.isupper()):
            for part in _PART.findall(word):
                if len(part) >= MIN_LENGTH:
                    yield _fold(part.lower())


@lru_cache(maxsize=65536)  # a pure function of the name; identifiers repeat across outputs
def name_parts(name: str) -> frozenset[str]:
    """``word_parts`` of one identifier, memoised."""
    return frozenset(word_parts(name))


def task_terms(text: str) -> frozenset[str]:
    """The distinctive words of a task statement, at most ``MAX_TERMS`` (first ones first)."""
    terms: dict[str, None] = {}
    for part in word_parts(text):
        if part not in COMMON and not part.isdigit():
            terms.setdefault(part, None)
            if len(terms) >= MAX_TERMS:
                break
    return frozenset(terms)
