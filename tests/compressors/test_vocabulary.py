"""Shell command lines: the one tokeniser (``shell_steps``) and what is read from it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressors.vocabulary import ShellStep, command_text, shell_program, shell_steps


def words(command: str) -> list[list[str]]:
    return [list(step.words) for step in shell_steps(command)]


def test_quotes_keep_separators_and_spaces_inside_a_word() -> None:
    assert words("""echo 'a && b; c | d' "x \\"y\\" $(date; id)" e\\ f""") == [
        ["echo", "a && b; c | d", 'x "y" $(date; id)', "e f"]
    ]
    assert words("echo 'unclosed && rm x") == [["echo", "unclosed && rm x"]]


def test_operators_split_simple_commands_and_say_what_joined_them() -> None:
    steps = shell_steps("cd /r && pytest -q || true; ls | wc -l &\nmake")
    assert [(list(s.words), s.after) for s in steps] == [
        (["cd", "/r"], ""),
        (["pytest", "-q"], "&&"),
        (["true"], "||"),
        (["ls"], ";"),
        (["wc", "-l"], "|"),
        (["make"], "\n"),
    ]


def test_wrappers_assignments_and_reserved_words_are_skipped() -> None:
    assert words("FOO=1 BAR='a b' sudo -E env X=2 timeout 30s nohup python -m pytest") == [
        ["python", "-m", "pytest"]
    ]
    assert words("find . -name '*.pyc' | xargs -n 1 rm") == [
        ["find", ".", "-name", "*.pyc"],
        ["rm"],
    ]
    assert words("if grep -q x f; then rm f; fi") == [["grep", "-q", "x", "f"], ["rm", "f"]]
    assert words("export A=1") == [["export", "A=1"]]  # a command, not an assignment
    assert words("A=1 B=2") == []


def test_redirections_leave_the_words_and_writes_are_kept() -> None:
    [step] = shell_steps("python run.py >out.txt 2>> err.log < in.txt 2>&1 &>all.log >&2")
    assert step == ShellStep(("python", "run.py"), ("out.txt", "err.log", "all.log"))
    assert shell_steps("> empty.txt") == [ShellStep((), ("empty.txt",))]
    assert words("diff <(sort a) <(sort b)") == [["diff", "<(sort a)", "<(sort b)"]]


def test_heredoc_bodies_are_data_and_the_commands_after_them_count() -> None:
    command = (
        "cat > f.py <<'EOF'\nimport os; rm -rf /\nEOF\n"
        "cat <<-END | sort\n\tb && c\n\tEND\npython f.py"
    )
    steps = shell_steps(command)
    assert [list(s.words) for s in steps] == [["cat"], ["cat"], ["sort"], ["python", "f.py"]]
    assert steps[0].writes == ("f.py",)
    assert words("git commit -m \"$(cat <<'EOF'\nfix: x; y\nEOF\n)\"") == [
        ["git", "commit", "-m", "$(cat <<'EOF'\nfix: x; y\nEOF\n)"]
    ]


def test_comments_groups_and_line_continuations() -> None:
    assert words("ls # then; rm x\npwd") == [["ls"], ["pwd"]]
    assert words("(cd sub && make) | tee log") == [["cd", "sub"], ["make"], ["tee", "log"]]
    assert words("pytest \\\n  -q tests/") == [["pytest", "-q", "tests/"]]
    assert words("a=(1 2 3); echo ${a[@]}") == [["echo", "${a[@]}"]]


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ("cd /repo && python -m pytest -q", "pytest"),
        ("pytest -x 2>&1 | tail -30", "pytest"),
        ("npm test || true", "npm"),
        ("sudo -E -H timeout 30 /usr/bin/make all", "make"),
        ("git grep -n foo", "git-grep"),
        ("cd /r", ""),
        ("cat > a.py <<'EOF'\nimport os\nEOF", "cat"),  # was "EOF": the heredoc's last line
        ("git add a && git commit -m \"$(cat <<'EOF'\nfix\nEOF\n)\"", "git"),  # was ')"'
        ('python -c "import m; print(1)"', "python"),  # was 'print(1)"'
        ("server & sleep 1 && curl -s localhost", "curl"),
    ],
)
def test_shell_program(command: str, program: str) -> None:
    assert shell_program(command) == program


def test_codex_argv_lists_are_read_as_their_script() -> None:
    arguments = '{"command": ["bash", "-lc", "cd /r && sed -n 1,80p a.py"]}'
    assert command_text(arguments) == "cd /r && sed -n 1,80p a.py"
    assert shell_program(command_text(arguments)) == "sed"
    assert command_text('{"command": ["rg", "-n", "a b"]}') == "rg -n 'a b'"
    assert words(command_text('{"command": ["rg", "-n", "a b"]}')) == [["rg", "-n", "a b"]]


@given(st.text(alphabet=" \t\n\\'\"$`()<>&|;#=-{}!2aEOF"))
def test_any_text_is_read_without_error(command: str) -> None:
    steps = shell_steps(command)  # terminates, never raises: it runs on the request path
    assert all(step.words or step.writes for step in steps)
    assert isinstance(shell_program(command), str)


@given(st.lists(st.lists(st.text("abc./-_", min_size=1), min_size=1), min_size=1))
def test_plain_words_read_back(commands: list[list[str]]) -> None:
    assert words(" && ".join(" ".join(c) for c in commands)) == commands
