"""One chat request as the request path sees it, and the two protocols of that path.

A ``Flow`` carries what a request knows, from its arrival to its answer: the dialect, the
session and request kind (identified once, before any addon runs), the project (identified by
the first addon when there is memory to serve), the body exactly as received, and what each
addon did. Addons (``proxy/addons.py`` lists them, in order) have one hook, ``request``; what
they did goes into the flow as a ``Report``: its ``account`` adds its figures to a statistics
tally, its ``changes`` says what it changed, item by item (the dashboard's request view,
``proxy.rewrites``). Nobody unpacks another addon's report.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from compressors.changes import Change
from compressors.pipeline import SeenTexts
from compressors.view import Conversation, Dialect
from memory.project import Resolution
from memory.threads import Background
from proxy.sessions import RequestKind, Tally

R = TypeVar("R")
# How long a request's bookkeeping waits for the work it began in the background (``begin``).
BEGUN_WAIT_SECONDS = 10.0


class Report(Protocol):
    """What an addon did to one request."""

    def account(self, tally: Tally) -> None:
        """Add this request's figures to ``tally`` (a session's, the totals, or the
        request's own)."""

    def changes(self) -> Sequence[Change]:
        """What the addon changed in the request, one entry per changed item."""


@dataclass(slots=True)
class Flow:
    dialect: Dialect
    session_id: str
    kind: RequestKind
    idle_seconds: float | None = None  # since the session's previous request, when known
    headers: Any = None  # the client's request headers
    raw: bytes = b""  # the body exactly as the client sent it
    project: Resolution | None = None  # None: nobody identified one (no memory is served)
    reports: list[Report] = field(default_factory=list)  # what the addons did, in order
    after: list[Callable[[], None]] = field(default_factory=list)  # see ``defer``
    starts: list[tuple[Background, Callable[[], None]]] = field(default_factory=list)  # ``begin``
    begun: list[Future[Any]] = field(default_factory=list)  # what ``start_begun`` started
    answer_waits: bool = False  # the answer is relayed once the begun work is done (``begin``)
    # What the session's earlier requests derived from the texts this one repeats (kept with
    # its parsed body, ``proxy.bodies``); a fresh one when there is none.
    seen: SeenTexts = field(default_factory=SeenTexts)

    def report(self, kind: type[R]) -> R | None:
        """The first report of this type, if an addon made one."""
        return next((found for found in self.reports if isinstance(found, kind)), None)

    def account(self, tally: Tally) -> None:
        for report in self.reports:
            report.account(tally)

    def defer(self, work: Callable[[], None]) -> None:
        """Run ``work`` once the answer has been relayed, on a worker thread that no request
        waits for, off this and every other request's path. It must not change what this
        request forwards, and it runs beside the session's next request (it may only fill
        caches); if that request comes before it has started, it never runs. A failure is
        logged and forgotten (``proxy.pipeline.RewriteRunner.run_after``)."""
        self.after.append(work)

    def begin(
        self, background: Background, work: Callable[[], None], *, answer_waits: bool = False
    ) -> None:
        """Run ``work`` on ``background`` as soon as the addons are done and the body is
        written (``start_begun``), while the request goes upstream. Unlike deferred work it
        must finish and is never cancelled: the session's next request waits for it, and so
        does the bookkeeping of what this request's reports count (``finish_begun``). With
        ``answer_waits``, so does the answer, at most ``BEGUN_WAIT_SECONDS``
        (``before_answer``): where the session's next request may reach another process
        (replicas), which cannot wait for this one's work, the client sends it only after."""
        self.starts.append((background, work))
        self.answer_waits = self.answer_waits or answer_waits

    def start_begun(self) -> None:
        """Start what the addons began (``begin``)."""
        for background, work in self.starts:
            try:
                self.begun.append(background.submit(work))
            except RuntimeError:  # the proxy is stopping: no background any more
                work()
        self.starts.clear()

    def finish_begun(self, timeout: float = BEGUN_WAIT_SECONDS) -> None:
        """Wait, at most ``timeout`` seconds, for the work begun for this request: on the
        bookkeeping's thread or a reader's worker thread (on the event loop only as the
        proxy stops, ``SessionRegistry.shutdown``)."""
        if self.begun:
            concurrent.futures.wait(self.begun, timeout)

    async def before_answer(self, timeout: float = BEGUN_WAIT_SECONDS) -> None:
        """On the event loop, once the upstream answers: wait for the begun work the answer
        waits for (``begin`` with ``answer_waits``), at most ``timeout`` seconds."""
        if self.answer_waits and self.begun:
            await asyncio.wait(list(map(asyncio.wrap_future, self.begun)), timeout=timeout)

    def changes(self) -> list[Change]:
        """Every addon's changes, in the order the addons ran."""
        return [change for report in self.reports for change in report.changes()]


class Addon(Protocol):
    """A stage of the request path."""

    def request(self, conversation: Conversation, flow: Flow) -> bool:
        """Read or change the parsed request in place; True when the body changed. What it
        did goes into ``flow.reports``. Raising makes the proxy forward the original bytes."""
