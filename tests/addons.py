"""Addons for tests: a request hook made of one function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from compressors.view import Conversation
from proxy.flow import Flow


@dataclass
class Hook:
    """An addon whose ``request`` is ``function``."""

    function: Callable[[Conversation, Flow], bool]

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        return self.function(conversation, flow)
