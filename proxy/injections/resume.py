"""Resume: a checkpoint's essentials, so work goes on where it stopped.

After a compaction, the session's own newest checkpoint goes once with the first user message
the proxy has not seen before (OpenCode restarts the history with "What did we do so far?" and
the summary; in mid tool loop that message is not the newest). On a session's first message,
the newest checkpoint of another session of the project goes with it instead, for continuity;
not for a subagent, whose parent has the context already.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from memory.archive import latest_checkpoint, session_checkpoints, session_dirname
from memory.checkpoint import Checkpoint, essentials
from memory.files import read_text
from memory.injection import RESUME_KIND, defang
from proxy.injections.base import Moment, Piece
from proxy.options import Option, parse_bool, parse_non_negative_int
from proxy.sessions import PARENT_SESSION_HEADER

log = logging.getLogger("deepmem.memory")

RESUME_OWN = "This conversation was compacted; deepmem saved a checkpoint first. Its essentials:"
RESUME_OTHER = (
    "deepmem's checkpoint of an earlier session in this project ({session}, {when}), for "
    "continuity; the user's message above comes first."
)
TAG_PREFIX = "resume:"


OPTIONS: tuple[Option, ...] = (
    Option(
        "resume",
        parse_bool,
        True,
        "After a compaction, and on the first message of a new session in a project that has "
        "a checkpoint, add the checkpoint's essentials beside the user message.",
        "BOOL",
    ),
    Option(
        "resume_tokens",
        parse_non_negative_int,
        800,
        "Token budget of the resume block.",
        "TOKENS",
    ),
)


@dataclass(slots=True)
class Resume:
    budget_tokens: int

    def decide(self, moment: Moment) -> list[Piece]:
        if moment.message is None:
            return []
        flow, memo = moment.flow, moment.memo
        memory_dir = moment.memory.memory_dir or moment.memory.global_dir
        own = session_checkpoints(memory_dir, flow.session_id)
        if own and not memo.tagged(TAG_PREFIX + own[0].stamp):
            chosen, intro = own[0], RESUME_OWN
        elif moment.newest and memo.turns == 0 and not _subagent(moment):
            latest = latest_checkpoint(memory_dir)
            if latest is None or latest.session == session_dirname(flow.session_id):
                return []
            chosen, intro = latest, RESUME_OTHER
        else:
            return []
        try:
            checkpoint = Checkpoint.parse(read_text(chosen.checkpoint))
        except (OSError, ValueError) as exc:
            log.warning("cannot read checkpoint %s: %s", chosen.checkpoint, exc)
            return []
        digest = essentials(checkpoint, self.budget_tokens)
        if not digest.strip():
            return []
        day = f"{chosen.stamp[:4]}-{chosen.stamp[4:6]}-{chosen.stamp[6:8]}"
        header = intro.format(session=checkpoint.session_id, when=day)
        tag = TAG_PREFIX + chosen.stamp
        moment.report.resumed = tag
        # The session id in the header is file text.
        return [Piece(RESUME_KIND, defang(header + "\n" + digest), tag)]


def _subagent(moment: Moment) -> bool:
    headers = moment.flow.headers
    return headers is not None and bool(headers.get(PARENT_SESSION_HEADER))
