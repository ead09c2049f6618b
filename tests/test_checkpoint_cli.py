"""``deepmem checkpoint show`` and ``deepmem memory consolidate`` from the command line."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memory.archive import RAW_FILE, write_checkpoint
from memory.checkpoint import Checkpoint
from memory.project import global_memory_dir
from proxy import cli_io
from tests.cli_result import Result, run

ALPHA = "ses_alpha"
BETA = "ses_beta"
T_ALPHA = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
T_BETA = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
SHARED_DECISION = "Use SQLite for proxy state"


@dataclass
class Cli:
    data: Path
    project: Path
    capsys: pytest.CaptureFixture[str]

    @property
    def memory_dir(self) -> Path:
        return self.project / ".deep-memory"

    def __call__(self, *argv: str) -> Result:
        where = (
            [] if "--global" in argv or "--project" in argv else ["--project", str(self.project)]
        )
        return run(self.capsys, [*argv, *where, "--data-dir", str(self.data)])

    def memory_md(self) -> str | None:
        path = self.memory_dir / "MEMORY.md"
        return path.read_text(encoding="utf-8") if path.exists() else None


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("DEEP_MEMORY_"):
            monkeypatch.delenv(name)
    # pytest's stdin is no terminal anyway; say so explicitly for the preview-only paths.
    monkeypatch.setattr(cli_io, "interactive", lambda: False)


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    project = tmp_path / "project"
    project.mkdir()
    return Cli(tmp_path / "data", project, capsys)


def _messages(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text} for text in texts]


def _write(memory_dir: Path, checkpoint: Checkpoint, messages: list[dict[str, Any]]) -> str:
    text = checkpoint.render()
    write_checkpoint(memory_dir, checkpoint.session_id, checkpoint.captured_at, messages, text)
    return text


@pytest.fixture
def two_sessions(cli: Cli) -> dict[str, str]:
    """Two sessions' checkpoints sharing one decision; the second (newest) one in Chinese."""
    alpha = _write(
        cli.memory_dir,
        Checkpoint(
            ALPHA,
            T_ALPHA,
            2,
            intents=["Add a cache to the proxy"],
            decisions=[SHARED_DECISION],
            constraints=["Never log API keys"],
        ),
        _messages("Add a cache to the proxy", "ok"),
    )
    beta = _write(
        cli.memory_dir,
        Checkpoint(
            BETA,
            T_BETA,
            3,
            intents=["修复登录页面的缓存问题"],
            decisions=[SHARED_DECISION, "数据库迁移使用 Alembic 管理"],
            gotchas=["pytest 在 Windows 上需要 UTF-8 编码"],
        ),
        _messages("修复登录页面的缓存问题", "好的", "完成"),
    )
    return {ALPHA: alpha, BETA: beta}


# ---------------------------------------------------------------- checkpoint show


def test_show_prints_the_newest_checkpoint_of_the_project(
    cli: Cli, two_sessions: dict[str, str]
) -> None:
    shown = cli("checkpoint", "show")
    assert shown.code == 0, shown.err
    assert shown.out == two_sessions[BETA]
    assert "修复登录页面的缓存问题" in shown.out and f"# Checkpoint — {BETA}" in shown.out


def test_show_session_prints_that_sessions_newest_archive(
    cli: Cli, two_sessions: dict[str, str]
) -> None:
    shown = cli("checkpoint", "show", "--session", ALPHA)
    assert shown.code == 0, shown.err
    assert shown.out == two_sessions[ALPHA]

    later = datetime(2026, 3, 3, 8, 0, tzinfo=UTC)
    newer = _write(
        cli.memory_dir,
        Checkpoint(ALPHA, later, 4, decisions=["Cache for 5 minutes"]),
        _messages("a", "b", "c", "d"),
    )
    assert cli("checkpoint", "show", "--session", ALPHA).out == newer
    assert cli("checkpoint", "show", "--session", BETA).out == two_sessions[BETA]


def test_show_raw_prints_the_raw_history(cli: Cli, two_sessions: dict[str, str]) -> None:
    raw = cli("checkpoint", "show", "--raw")
    assert raw.code == 0, raw.err
    data = raw.json
    assert data["sessionID"] == BETA and data["messageCount"] == 3
    assert data["messages"][0]["content"] == "修复登录页面的缓存问题"
    assert raw.out.rstrip("\n") == (cli.memory_dir / RAW_FILE).read_text(encoding="utf-8")

    alpha = cli("checkpoint", "show", "--session", ALPHA, "--raw").json
    assert alpha["sessionID"] == ALPHA and alpha["capturedAt"] == T_ALPHA.isoformat()


def test_show_json(cli: Cli, two_sessions: dict[str, str]) -> None:
    shown = cli("checkpoint", "show", "--json")
    assert shown.code == 0, shown.err
    assert shown.json == {
        "path": str(cli.memory_dir / "checkpoint.md"),
        "session": BETA,
        "captured": T_BETA.isoformat(),
        "text": two_sessions[BETA],
    }

    alpha = cli("checkpoint", "show", "--session", ALPHA, "--json").json
    assert alpha["session"] == ALPHA and alpha["captured"] == T_ALPHA.isoformat()
    assert Path(alpha["path"]).parent == cli.memory_dir / "sessions" / ALPHA
    assert alpha["text"] == two_sessions[ALPHA]

    raw = cli("checkpoint", "show", "--raw", "--json").json
    assert raw["path"] == str(cli.memory_dir / RAW_FILE)
    assert raw["session"] == BETA and raw["captured"] == T_BETA.isoformat()
    assert json.loads(raw["text"])["messageCount"] == 3


def test_show_falls_back_to_the_newest_archive_without_checkpoint_md(
    cli: Cli, two_sessions: dict[str, str]
) -> None:
    (cli.memory_dir / "checkpoint.md").unlink()
    shown = cli("checkpoint", "show", "--json").json
    assert shown["session"] == BETA and shown["text"] == two_sessions[BETA]
    assert Path(shown["path"]).parent == cli.memory_dir / "sessions" / BETA


def test_show_without_a_checkpoint_names_the_directory(cli: Cli, tmp_path: Path) -> None:
    missing = cli("checkpoint", "show")
    assert missing.code == 1 and missing.out == ""
    assert missing.err.startswith("deepmem: no checkpoint in ")
    assert str(cli.memory_dir) in missing.err and "Traceback" not in missing.err

    global_missing = cli("checkpoint", "show", "--global")
    assert global_missing.code == 1
    assert global_missing.err.startswith("deepmem: no checkpoint in ")
    assert str(global_memory_dir(cli.data)) in global_missing.err

    gone = cli("checkpoint", "show", "--project", str(tmp_path / "nowhere"))
    assert gone.code == 2 and "does not exist" in gone.err


def test_show_unknown_session_names_the_directory_and_the_known_sessions(
    cli: Cli, two_sessions: dict[str, str]
) -> None:
    missing = cli("checkpoint", "show", "--session", "ses_gamma")
    assert missing.code == 1 and missing.out == ""
    assert missing.err.startswith("deepmem: no checkpoint for session 'ses_gamma' in ")
    assert str(cli.memory_dir / "sessions" / "ses_gamma") in missing.err
    assert f"{ALPHA}, {BETA}" in missing.err

    (cli.memory_dir / RAW_FILE).unlink()
    no_raw = cli("checkpoint", "show", "--raw")
    assert no_raw.code == 1 and str(cli.memory_dir / RAW_FILE) in no_raw.err


def test_global_checkpoints(cli: Cli) -> None:
    global_dir = global_memory_dir(cli.data)
    text = _write(global_dir, Checkpoint("ses_global", T_ALPHA, 1), _messages("hi"))
    shown = cli("checkpoint", "show", "--global")
    assert shown.code == 0 and shown.out == text


# ---------------------------------------------------------------- memory consolidate


def test_consolidate_preview_without_a_terminal_adds_nothing(
    cli: Cli, two_sessions: dict[str, str]
) -> None:
    preview = cli("memory", "consolidate")
    assert preview.code == 2, preview.err
    assert "would add 1, skipped 0" in preview.out
    assert f"+ [Decisions] {SHARED_DECISION} (2 sources)" in preview.out
    assert "line(s) seen in fewer than 2 sources not shown" in preview.out
    assert (
        "not added: confirmation needed and there is no terminal to ask on; "
        "rerun with --force to add 1"
    ) in preview.err
    assert cli.memory_md() is None

    as_json = cli("memory", "consolidate", "--json")
    assert as_json.code == 2
    assert as_json.json["written"] is False
    assert [c["text"] for c in as_json.json["added"]] == [SHARED_DECISION]
    assert sorted(as_json.json["added"][0]["sources"]) == [ALPHA, BETA]
    assert any(s["text"] == "数据库迁移使用 Alembic 管理" for s in as_json.json["skipped"])
    assert cli.memory_md() is None


def test_consolidate_force_adds_then_reports_a_duplicate(
    cli: Cli, two_sessions: dict[str, str]
) -> None:
    added = cli("memory", "consolidate", "--force")
    assert added.code == 0, added.err
    assert "added 1 entry to " in added.out
    memory_md = cli.memory_md()
    assert memory_md is not None and f"- {SHARED_DECISION} [" in memory_md
    assert "## Decisions" in memory_md and "Alembic" not in memory_md

    again = cli("memory", "consolidate", "--force")
    assert again.code == 0
    assert "would add 0, skipped 1" in again.out
    assert f"- [Decisions] {SHARED_DECISION}: exact duplicate of [" in again.out
    assert "added" not in again.out.splitlines()[-1]
    assert cli.memory_md() == memory_md

    as_json = cli("memory", "consolidate", "--force", "--json").json
    assert as_json["added"] == [] and as_json["written"] is False
    assert any(s["reason"].startswith("exact duplicate") for s in as_json["skipped"])


def test_consolidate_dry_run_never_writes(cli: Cli, two_sessions: dict[str, str]) -> None:
    dry = cli("memory", "consolidate", "--dry-run", "--force")
    assert dry.code == 0
    assert "would add 1" in dry.out and "dry run: nothing added" in dry.out
    as_json = cli("memory", "consolidate", "--dry-run", "--json").json
    assert as_json["written"] is False and len(as_json["added"]) == 1
    assert cli.memory_md() is None


def test_consolidate_min_count(cli: Cli, two_sessions: dict[str, str]) -> None:
    three = cli("memory", "consolidate", "--min-count", "3", "--force")
    assert three.code == 0
    assert "would add 0" in three.out and "fewer than 3 sources not shown" in three.out
    assert cli.memory_md() is None

    with pytest.raises(SystemExit) as exc:
        cli("memory", "consolidate", "--min-count", "0")
    assert exc.value.code == 2


def test_consolidate_on_a_terminal_asks_first(
    cli: Cli, two_sessions: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_io, "interactive", lambda: True)
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    declined = cli("memory", "consolidate")
    assert "nothing added" in declined.out and "[y/N]" in declined.err
    assert cli.memory_md() is None

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    confirmed = cli("memory", "consolidate")
    assert "added 1 entry" in confirmed.out
    memory_md = cli.memory_md()
    assert memory_md is not None and SHARED_DECISION in memory_md


def test_consolidate_with_nothing_to_read(cli: Cli) -> None:
    empty = cli("memory", "consolidate", "--force")
    assert empty.code == 0
    assert "0 file(s), 0 source(s)" in empty.out and "would add 0, skipped 0" in empty.out
    assert cli.memory_md() is None


def test_show_reads_no_checkpoint_through_a_symlink_out_of_the_project(cli: Cli, tmp_path: Path):
    outside = tmp_path / "outside.md"
    outside.write_text("# Checkpoint — OUTSIDE-SECRET\n")
    cli.memory_dir.mkdir()
    (cli.memory_dir / "checkpoint.md").symlink_to(outside)
    result = cli("checkpoint", "show")
    assert result.code != 0 and "OUTSIDE-SECRET" not in result.out
    assert "leads outside" in result.err
