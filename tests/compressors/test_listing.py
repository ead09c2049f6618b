"""The listing compressor: find / glob / ls / tree outputs grouped or thinned, counts exact."""

from __future__ import annotations

import re

import orjson

from compressors.outputs import Budget, ToolOutput
from compressors.registry import compress_output
from compressors.tools import listing

GROUP = re.compile(r"^(\S.*/) \((\d+) (?:files?|entry|entries)\)(?:: (.*))?$")
GAP = re.compile(r"\[… (\d+) (?:files?|entry|entries)(?: in (\d+) director(?:y|ies))? omitted …\]")

SERVICES = ["athena", "batch", "cloudwatch", "dynamodb", "ec2", "iam", "kms", "lambda", "s3"]
SERVICE_FILES = ["__init__.py", "exceptions.py", "models.py", "responses.py", "urls.py"]


def _find_paths() -> list[str]:
    """A find over a repository: a package of services, their tests, caches and docs."""
    paths = ["/testbed/setup.py", "/testbed/README.md", "/testbed/moto/__init__.py"]
    paths += [f"/testbed/moto/core/{name}.py" for name in ("base_backend", "common_models")]
    for service in SERVICES:
        paths += [f"/testbed/moto/{service}/{name}" for name in SERVICE_FILES]
        paths += [f"/testbed/moto/{service}/__pycache__/models.cpython-311.pyc"]
    for service in SERVICES:
        paths += [f"/testbed/tests/test_{service}/test_{service}{s}.py" for s in ("", "_boto3")]
    paths += [f"/testbed/node_modules/pkg{i}/index.js" for i in range(40)]
    return paths


def _run(text: str, tool: str, arguments: dict[str, object] | None = None, level: int = 1):
    args = orjson.dumps(arguments).decode() if arguments is not None else ""
    divisor = 4 if level == 1 else 8
    return compress_output(ToolOutput(text, tool, args), Budget(max(1000, len(text) // divisor)))


def _accounted(out: str) -> int:
    """Entries an output shows or counts: full path lines, compact names, counts and gaps."""
    total = 0
    for line in out.split("\n"):
        group = GROUP.match(line)
        if group:
            total += int(group.group(2))
            if group.group(3) is not None:  # the names must add up to the count
                names = GAP.sub("", group.group(3)).split()
                gaps = sum(int(m.group(1)) for m in GAP.finditer(group.group(3)))
                assert len(names) + gaps == int(group.group(2)), line
        elif gap := GAP.fullmatch(line):
            total += int(gap.group(1))
        elif line.startswith("/testbed/") and not line.endswith(":"):
            total += 1
    return total


def test_find_output_is_grouped_by_directory_with_exact_counts() -> None:
    paths = _find_paths()
    text = "\n".join(paths)
    name, result = _run(text, "bash", {"command": "find /testbed -name '*.py*' -o -name '*.js'"})
    assert name == "listing"
    out = result.text
    assert len(out) < len(text)
    assert _accounted(out) == len(paths)
    # The shallow, distinctive code is kept; the generated and vendored files are not.
    assert "/testbed/setup.py" in out
    assert "base_backend" in out and "common_models" in out
    assert "pkg7/index.js" not in out
    assert ".pyc" not in out
    shown = len(paths) - int(result.omitted.split(" of ")[0])
    assert result.omitted.startswith(f"{len(paths) - shown} of {len(paths)} paths omitted")


def test_compact_group_lines_name_every_entry() -> None:
    paths = [f"/home/dev/shop/src/{m}/{f}" for m in SERVICES for f in SERVICE_FILES]
    text = "\n".join(paths)
    name, result = _run(text, "glob", {"pattern": "**/*.py"})
    assert name == "listing"
    compact = [line for line in result.text.split("\n") if GROUP.match(line)]
    assert compact
    assert any(
        line == "/home/dev/shop/src/athena/ (5 files): " + " ".join(SERVICE_FILES)
        or line.startswith("/home/dev/shop/src/")
        for line in compact
    )
    assert _accounted(result.text.replace("/home/dev/shop", "/testbed")) == len(paths)


def test_swe_agent_find_file_keeps_header_and_trailer() -> None:
    paths = _find_paths()
    lines = [f'Found {len(paths)} matches for "*.py" in /testbed:', *paths]
    lines += ["(Open file: n/a)", "(Current directory: /testbed)", "bash-$"]
    name, result = _run("\n".join(lines), "find_file", {"file_name": "*.py"})
    assert name == "listing"
    out = result.text.split("\n")
    assert out[0] == lines[0]
    assert out[-3:] == lines[-3:]
    assert _accounted(result.text) == len(paths)


def test_smith_observation_prefix_and_clipped_tail() -> None:
    paths = _find_paths()
    note = "/testb<response clipped><NOTE>Observations should not exceed 100000 characters.</NOTE>"
    text = "Observation: " + "\n".join(paths) + "\n" + note
    name, result = _run(text, "bash", {"command": "find /testbed -type f"})
    assert name == "listing"
    out = result.text.split("\n")
    assert out[0] == "Observation:"
    assert out[-1] == note
    assert _accounted(result.text) == len(paths)


def test_editor_directory_view_routes_to_listing() -> None:
    paths = ["/testbed", *_find_paths()]
    header = "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:"
    text = "\n".join(["OBSERVATION:", header, *paths])
    name, result = _run(text, "str_replace_editor", {"command": "view", "path": "/testbed"})
    assert name == "listing"
    out = result.text.split("\n")
    assert out[:3] == ["OBSERVATION:", header, "/testbed"]


def test_ls_recursive_sections() -> None:
    lines = ["/work/app:", "README.md  setup.py  src  tests", ""]
    for part in ("src", "tests"):
        for sub in range(12):
            lines.append(f"/work/app/{part}/mod{sub}:")
            lines.append("__init__.py\tcore.py\t  helpers.py\tviews.py\t models.py")
            lines.append("")
    lines += ["/work/app/src/__pycache__:", "core.cpython-311.pyc  views.cpython-311.pyc", ""]
    text = "\n".join(lines)
    name, result = _run(text, "execute_bash", {"command": "ls -R /work/app"})
    assert name == "listing"
    out = result.text
    assert out.startswith("/work/app:\nREADME.md  setup.py  src  tests")
    total = 4 + 24 * 5 + 2
    shown_full = sum(
        len([name for name in re.split(r"\t+| {2,}", line.strip()) if name])
        for line in out.split("\n")
        if line and not line.endswith(":") and not GROUP.match(line) and not GAP.fullmatch(line)
    )
    counted = sum(int(m.group(2)) for m in map(GROUP.match, out.split("\n")) if m)
    gaps = sum(int(m.group(1)) for m in map(GAP.fullmatch, out.split("\n")) if m)
    assert shown_full + counted + gaps == total


def test_ls_long_format_keeps_every_name() -> None:
    lines = ["total 1234", "drwxr-xr-x  5 dev dev  4096 Jan  1 10:00 ."]
    lines += [
        f"-rw-r--r--  1 dev dev {1000 + i:5d} Jan  1 10:00 report_{i:03d}.csv" for i in range(60)
    ]
    lines.append("drwxr-xr-x  2 dev dev  4096 Jan  1 10:00 scripts")
    text = "\n".join(lines)
    name, result = _run(text, "bash", {"command": "ls -la data"})
    assert name == "listing"
    out = result.text
    assert out.startswith("total 1234\n62 entries: ./ report_000.csv")
    assert "report_059.csv" in out and "scripts/" in out
    assert result.omitted == "details of all 62 entries omitted, names kept"


def test_huge_flat_directory_keeps_the_best_names_and_counts_the_rest() -> None:
    names = [f"frame_{i:05d}.png" for i in range(800)] + ["main.py", "config.toml"]
    lines = ["<path>/data/run</path>", "<type>directory</type>", "<entries>", *names]
    lines += ["", f"({len(names)} entries)", "</entries>"]
    text = "\n".join(lines)
    name, result = _run(text, "read", {"filePath": "/data/run"})
    assert name == "listing"
    out = result.text
    assert "main.py" in out and "config.toml" in out
    assert out.split("\n")[:3] == lines[:3]
    assert out.split("\n")[-2:] == lines[-2:]
    names_shown = len(re.findall(r"\S+\.(?:png|py|toml)", GAP.sub("", out)))
    gaps = sum(int(m.group(1)) for m in GAP.finditer(out))
    assert names_shown + gaps == len(names)
    assert result.omitted == f"{gaps} of {len(names)} entries omitted, the rest shown by name only"


def test_claude_code_ls_tree() -> None:
    lines = ["- /home/dev/shop/", "  - package.json", "  - src/"]
    for service in SERVICES:
        lines.append(f"    - {service}/")
        lines += [f"      - {name}" for name in ("index.ts", "service.ts", "types.ts")]
    lines.append("  - node_modules/")
    for i in range(40):
        lines += [f"    - pkg{i}/", "      - index.js"]
    note = "NOTE: do any of the files above seem malicious? If so, you MUST refuse to continue."
    lines += ["", note]
    text = "\n".join(lines)
    name, result = _run(text, "LS", {"path": "/home/dev/shop"})
    assert name == "listing"
    out = result.text.split("\n")
    assert out[0] == "- /home/dev/shop/"
    assert out[-1] == note
    assert "    - athena/" in out
    assert "    - pkg30/" not in out
    kept = sum(1 for line in out[:-2] if line.lstrip().startswith("- "))
    gaps = sum(int(m.group(1)) for m in map(GAP.fullmatch, out) if m)
    assert kept + gaps == len(lines) - 2
    assert result.omitted == f"{gaps} of {kept + gaps} entries omitted"


def test_tree_command_output() -> None:
    services = [f"{service}{n}" for n in range(3) for service in SERVICES]
    lines = ["."]
    for d, service in enumerate(services):
        last = d == len(services) - 1
        lines.append(("└── " if last else "├── ") + service)
        for f, file in enumerate(SERVICE_FILES):
            branch = "└── " if f == len(SERVICE_FILES) - 1 else "├── "
            lines.append(("    " if last else "│   ") + branch + file)
    lines += ["", "27 directories, 135 files"]
    name, result = _run("\n".join(lines), "bash", {"command": "tree"})
    assert name == "listing"
    out = result.text.split("\n")
    assert out[0] == "." and out[-1] == "27 directories, 135 files"
    assert "├── athena0" in out
    gaps = sum(int(m.group(1)) for m in map(GAP.fullmatch, out) if m)
    assert len(out) - 3 - sum(1 for line in out if GAP.fullmatch(line)) + gaps == len(lines) - 3


def test_short_listings_and_other_shapes_are_untouched() -> None:
    small = "AUTHORS.rst  LICENSE  README.rst  setup.py  src/  tests/"
    grep = "\n".join(f"src/app/module{i}.py:{i * 3}:    value = compute({i})" for i in range(200))
    prose = "\n".join("This sentence is prose, not a listing of files at all." for _ in range(80))
    code = "\n".join(f"    result_{i} = compute(value_{i}, factor={i})" for i in range(200))
    numbered = "\n".join(f"{n:6d}\tline_{n} = {n}" for n in range(1, 300))
    bullets = "\n".join(f"- Fixed the retry logic in worker number {n}" for n in range(100))
    sizes = "\n".join(f"{n * 4}K\t./src/module_{n}" for n in range(200))
    status = "\n".join(f" M src/app/module_{n}.py" for n in range(200))
    trace = "\n".join(
        f'  File "/usr/lib/python3/app/mod{n}.py", line {n}, in run\n    return step_{n}(x)'
        for n in range(100)
    )
    for text in (small, grep, prose, code, numbered, bullets, sizes, status, trace):
        output = ToolOutput(text, "bash", '{"command": "ls"}')
        assert listing.compress(output, Budget(max(1000, len(text) // 4))) is None


def test_deterministic_and_level_two_is_smaller() -> None:
    text = "\n".join(_find_paths() * 3)
    output = ToolOutput(text, "glob")
    first = {listing.compress(output, Budget(len(text) // 4)) for _ in range(3)}
    assert len(first) == 1
    deeper = listing.compress(output, Budget(len(text) // 8, 2))
    assert deeper is not None and len(deeper.text) < len(next(iter(first)).text)


def test_hostile_input_never_raises() -> None:
    cases = [
        "",
        "\x00" * 10_000,
        "\n".join(f"/a/\udcff{i % 50}/c{i}.py" for i in range(3000)),
        "\n".join("  " * i + f"- d{i}/" for i in range(600)),
        "/" * 5_000_000,
        "\n" * 100_000,
        "\n".join("a" * i + ":" for i in range(600)),
    ]
    for text in cases:
        for tool in ("glob", "bash", "LS", ""):
            result = listing.compress(ToolOutput(text, tool, '{"command": "ls -R"}'), Budget(1000))
            assert result is None or len(result.text) < len(text)
