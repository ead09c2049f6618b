"""``deepmem memory ...``: the memory files edited from the command line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy import cli_io
from proxy.cli import main
from tests.cli_result import Result, run

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Cli:
    data: Path
    project: Path
    capsys: pytest.CaptureFixture[str]

    def __call__(self, *argv: str, project: Path | None = None) -> Result:
        where = ["--project", str(project or self.project)]
        if "--global" in argv or "--project" in argv:
            where = []
        return run(self.capsys, ["memory", *argv, *where, "--data-dir", str(self.data)])

    def texts(self, project: Path | None = None) -> list[str]:
        return [e["text"] for e in self("list", "--json", project=project).json["entries"]]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("DEEP_MEMORY_"):
            monkeypatch.delenv(name)


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    project = tmp_path / "project"
    project.mkdir()
    return Cli(tmp_path / "data", project, capsys)


def test_store_english_and_chinese_and_refuse_duplicates(cli: Cli) -> None:
    first = cli("store", "decisions", "Use", "SQLite", "for", "proxy", "state")
    assert first.code == 0 and "stored [" in first.out and "Decisions" in first.out
    chinese = cli("store", "Facts", "数据库使用 SQLite 存储会话状态")
    assert chinese.code == 0 and "Facts" in chinese.out
    memory_md = (cli.project / ".deep-memory" / "MEMORY.md").read_text(encoding="utf-8")
    assert "- Use SQLite for proxy state [" in memory_md
    assert "- 数据库使用 SQLite 存储会话状态 [" in memory_md

    exact = cli("store", "DECISIONS", "use sqlite for proxy state.")
    assert exact.code == 1
    assert exact.err.startswith("deepmem: not stored: exact duplicate")
    near = cli("store", "Facts", "数据库使用 SQLite 存储会话状态了", "--json")
    assert near.code == 1
    assert near.json["stored"] is False and "near-duplicate" in near.json["reason"]
    assert cli.texts() == ["Use SQLite for proxy state", "数据库使用 SQLite 存储会话状态"]


def test_search_ranks_the_matching_entry_first(cli: Cli) -> None:
    cli("store", "Decisions", "Use SQLite for proxy state")
    cli("store", "Gotchas", "Ruff format must run before commit")
    cli("store", "Constraints", "Never log API keys or bearer tokens")
    cli("store", "Facts", "会话状态保存在数据目录里")

    result = cli("search", "ruff format")
    assert result.code == 0
    first, where = result.out.splitlines()[:2]
    assert first.startswith("1. (Gotchas) Ruff format must run before commit")
    assert "MEMORY.md:" in where and "score" in where

    hits = cli("search", "API keys|数据目录", "--limit", "2", "--json").json["results"]
    assert {hit["section"] for hit in hits} == {"Constraints", "Facts"}
    assert cli("search", "kubernetes").out.startswith("no matches")


def test_list_and_stats(cli: Cli) -> None:
    assert "no entries" in cli("list").out
    cli("store", "Decisions", "Use SQLite for proxy state")
    cli("store", "gotchas", "Ruff format must run before commit")

    lines = cli("list").out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[") and "Decisions: Use SQLite" in lines[0]
    only = cli("list", "--section", "GOTCHAS", "--json").json
    assert [e["section"] for e in only["entries"]] == ["Gotchas"]
    assert only["project"] == str(cli.project.resolve())
    assert only["chosen_by"] == "command line"

    stats = cli("stats")
    assert "entries: 2 (Decisions 1, Constraints 0, Gotchas 1, Facts 0, Notes 0)" in stats.out
    data = cli("stats", "--json").json
    assert data["entries"] == 2 and data["sections"]["Gotchas"] == 1


def test_forget_previews_without_a_terminal_then_deletes_with_force(cli: Cli) -> None:
    cli("store", "Decisions", "Use SQLite for proxy state")
    cli("store", "Facts", "SQLite lives in the data dir")
    cli("store", "Gotchas", "Ruff format must run before commit")

    preview = cli("forget", "sqlite")
    assert preview.code == 2  # nothing deleted: a script must not take this for success
    assert "2 entries matched" in preview.out
    assert preview.err == (
        "deepmem: not deleted: confirmation needed and there is no terminal to ask on; "
        "rerun with --force to delete 2\n"
    )
    as_json = cli("forget", "sqlite", "--json")
    assert as_json.code == 2 and len(as_json.json["matched"]) == 2
    assert cli("forget", "kubernetes").code == 0  # nothing matched: nothing to confirm
    assert len(cli.texts()) == 3

    deleted = cli("forget", "sqlite", "--force")
    assert deleted.code == 0 and "deleted 2 entries" in deleted.out
    assert cli.texts() == ["Ruff format must run before commit"]

    entry_id = cli("list", "--json").json["entries"][0]["id"]
    by_id = cli("forget", "--ids", entry_id, "--force", "--json").json
    assert by_id["removed"] is True and [e["id"] for e in by_id["matched"]] == [entry_id]
    assert cli.texts() == []


def test_forget_on_a_terminal_deletes_exactly_the_previewed_entries(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli("store", "Decisions", "Use SQLite for proxy state")
    cli("store", "Notes", "Keep the proxy stateless")
    monkeypatch.setattr(cli_io, "interactive", lambda: True)

    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    declined = cli("forget", "proxy")
    assert "nothing deleted" in declined.out and "[y/N]" in declined.err
    assert len(cli.texts()) == 2

    def confirm_after_another_store(question: str) -> bool:
        # An entry that matches the query but arrives after the preview must survive.
        argv = ["memory", "store", "Facts", "The proxy binds loopback"]
        main([*argv, "--project", str(cli.project), "--data-dir", str(cli.data)])
        return True

    monkeypatch.setattr(cli_io, "confirm", confirm_after_another_store)
    confirmed = cli("forget", "proxy")
    assert "deleted 2 entries" in confirmed.out
    assert cli.texts() == ["The proxy binds loopback"]


def test_forget_needs_ids_or_query_not_both(cli: Cli) -> None:
    neither = cli("forget")
    both = cli("forget", "x", "--ids", "abcd1234")
    for result in (neither, both):
        assert result.code == 2
        assert result.err.startswith("deepmem: forget needs either --ids")
        assert "Traceback" not in result.err


def test_export_json_import_round_trip(cli: Cli, tmp_path: Path) -> None:
    cli("store", "Decisions", "Use SQLite for proxy state")
    cli("store", "Constraints", "Never log API keys")
    cli("store", "Facts", "会话状态保存在数据目录里")
    dump = tmp_path / "export.json"
    exported = cli("export", "--output", str(dump))
    assert exported.code == 0 and dump.exists()
    assert cli("export").out == dump.read_text(encoding="utf-8")

    other = tmp_path / "other"
    other.mkdir()
    imported = cli("import", str(dump), "--json", project=other)
    assert imported.code == 0 and imported.json["added"] == 3
    original = cli("list", "--json").json["entries"]
    copied = cli("list", "--json", project=other).json["entries"]
    assert copied == original

    markdown = cli("export", "--format", "markdown").out
    assert markdown.startswith("# ") and "## Constraints" in markdown


def test_import_reports_duplicates_and_force_adds_near_ones(cli: Cli, tmp_path: Path) -> None:
    text = "Use SQLite in WAL mode for all proxy session state and sweep old originals daily"
    cli("store", "Decisions", text)
    near = text.replace("daily", "nightly")
    incoming = {
        "version": 1,
        "entries": [
            {"section": "Decisions", "text": text.lower(), "date": "2024-01-02"},
            {"section": "Decisions", "text": near, "date": None},
            {"section": "Facts", "text": "A brand new fact", "date": "2024-01-03"},
        ],
    }
    source = tmp_path / "incoming.json"
    source.write_text(json.dumps(incoming), encoding="utf-8")

    first = cli("import", str(source))
    assert first.code == 0
    assert "imported 1 entry" in first.out and "skipped 2 duplicate(s)" in first.out
    assert "exact duplicate" in first.out and "near-duplicate" in first.out
    assert "--force" in first.out

    forced = cli("import", str(source), "--force", "--json").json
    assert forced["added"] == 1 and forced["duplicates"] == 2
    assert [s["reason"].split()[0] for s in forced["skipped"]] == ["exact", "exact"]
    assert near in cli.texts()


def test_import_errors_exit_cleanly(cli: Cli, tmp_path: Path, monkeypatch) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"entries": [', encoding="utf-8")
    broken = cli("import", str(bad))
    assert broken.code == 1 and broken.err.startswith("deepmem: cannot import")

    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"section": "Ideas", "text": "x"}]), encoding="utf-8")
    assert cli("import", str(wrong)).code == 1

    missing = cli("import", str(tmp_path / "nope.json"))
    assert missing.code == 2 and missing.err.startswith("deepmem: cannot read")

    monkeypatch.setattr(sys, "stdin", io.StringIO("## Notes\n\n- From stdin [2024-05-06]\n"))
    assert cli("import", "-").code == 0
    assert cli.texts() == ["From stdin"]
    for result in (broken, missing):
        assert "Traceback" not in result.err


def test_cleanup_older_than_dry_run_then_force(cli: Cli, tmp_path: Path) -> None:
    cli("store", "Decisions", "Use SQLite for proxy state")
    cli("store", "Facts", "The proxy binds loopback")
    cli("store", "Notes", "Fresh note about tokens")
    export = json.loads(cli("export").out)
    for entry in export["entries"]:
        if entry["section"] != "Notes":
            entry["date"] = "2020-03-04"
    old = tmp_path / "old.json"
    old.write_text(json.dumps(export), encoding="utf-8")
    aged = tmp_path / "aged"
    aged.mkdir()
    assert cli("import", str(old), project=aged).code == 0

    missing = cli("cleanup", project=aged)
    assert missing.code == 2 and "needs at least one of --older-than" in missing.err

    dry = cli("cleanup", "--older-than", "30", "--dry-run", "--force", project=aged)
    assert dry.code == 0 and "2 entries matched" in dry.out and "nothing removed" in dry.out
    assert len(cli.texts(aged)) == 3

    preview = cli("cleanup", "--older-than", "30", project=aged)  # no terminal, no --force
    assert preview.code == 2 and "2 entries matched" in preview.out
    assert "not deleted: confirmation needed" in preview.err and "--force" in preview.err
    assert len(cli.texts(aged)) == 3

    facts = ("cleanup", "--older-than", "30", "--section", "facts", "--json", "--force")
    only_facts = cli(*facts, project=aged).json
    assert only_facts["removed"] is True
    assert [e["text"] for e in only_facts["matched"]] == ["The proxy binds loopback"]

    removed = cli("cleanup", "--older-than", "30", "--force", project=aged)
    assert "deleted 1 entry" in removed.out
    assert cli.texts(aged) == ["Fresh note about tokens"]


def test_global_memory_is_separate_and_searched_by_projects(cli: Cli, tmp_path: Path) -> None:
    stored = cli("store", "Constraints", "Answer in English", "--global", "--json")
    assert stored.code == 0
    assert stored.json["project"] is None and stored.json["chosen_by"] == "global scope"
    assert stored.json["memory_dir"] == str(cli.data / "memory")
    assert (cli.data / "memory" / "MEMORY.md").exists()

    assert cli.texts() == []
    assert [e["text"] for e in cli("list", "--global", "--json").json["entries"]] == [
        "Answer in English"
    ]
    assert "global memory" in cli("stats", "--global").out
    assert "Answer in English" in cli("search", "english").out


def test_bad_project_and_bad_arguments_exit_2_without_traceback(cli: Cli, tmp_path: Path) -> None:
    missing = cli("stats", "--project", str(tmp_path / "missing"))
    assert missing.code == 2
    assert missing.err == f"deepmem: project directory '{tmp_path / 'missing'}' does not exist\n"

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert "is not a directory" in cli("list", "--project", str(a_file)).err

    section = cli("store", "Ideas", "something")
    assert section.code == 2 and section.err.startswith("deepmem: unknown section 'Ideas'")
    limit = cli("search", "x", "--limit", "500")
    assert limit.code == 2 and "limit must be 1..50" in limit.err
    for result in (missing, section, limit):
        assert "Traceback" not in result.err


def test_project_defaults_to_the_working_directory(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(cli.project)
    assert main(["memory", "store", "Notes", "here", "--data-dir", str(cli.data)]) == 0
    assert cli.capsys.readouterr().out
    assert (cli.project / ".deep-memory" / "MEMORY.md").exists()


def test_settings_flags_apply(cli: Cli) -> None:
    result = cli("store", "Notes", "custom dir", "--memory-dir-name", ".mem", "--json")
    assert result.json["memory_dir"] == str(cli.project.resolve() / ".mem")
    assert (cli.project / ".mem" / "MEMORY.md").exists()


@pytest.mark.slow
def test_entry_points_run_outside_pytest(cli: Cli) -> None:
    cli("store", "Decisions", "Use SQLite for proxy state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEP_MEMORY_")}
    argv = ["memory", "stats", "--json", "--project", str(cli.project), "--data-dir", str(cli.data)]
    commands = [[sys.executable, "-m", "proxy", *argv]]
    script = Path(sys.executable).parent / "deepmem"
    if script.exists():
        commands.append([str(script), *argv])
    for command in commands:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["entries"] == 1

    failed = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy",
            "memory",
            "list",
            "--project",
            "/no/such/dir",
            "--data-dir",
            str(cli.data),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("deepmem: project directory")
    assert "Traceback" not in failed.stderr
