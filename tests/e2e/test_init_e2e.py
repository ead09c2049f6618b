"""``deepmem init`` end to end: the config it writes carries the real OpenCode CLI through deepmem.

The user's own ``opencode.json`` (comments, trailing commas, a custom OpenAI-compatible
provider pointing straight at the provider) is rewritten by ``deepmem init``, deepmem is
started from nothing but the TOML file ``deepmem init`` wrote, and one real ``opencode run``
goes through it to the scripted fake LLM (``init_scenario.py``; the same offline harness and
pinned OpenCode as ``test_opencode.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e import harness
from tests.e2e.fake_llm import FINAL1
from tests.e2e.test_opencode import Verdict, opencode_binary  # noqa: F401  (a fixture)

RUNNER = "tests.e2e.init_scenario"


@pytest.mark.slow
def test_opencode_runs_through_the_config_deepmem_init_wrote(
    opencode_binary: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    try:
        result = harness.run_scenario("openai-compatible", opencode_binary, tmp_path, RUNNER)
    except harness.E2EError as exc:
        pytest.fail(str(exc), pytrace=False)
    init, upstream, port = result["init"], result["upstream"], result["proxy_port"]

    # what deepmem init wrote: the user's file with two spots changed, and deepmem's upstream
    before, after = result["user_config"], init["config"]
    expected = before.replace(
        f'"baseURL": "{upstream}"', f'"baseURL": "http://127.0.0.1:{port}/e2e"'
    ).replace(
        "    },\n  },\n}\n",
        "    },\n  },\n"
        '  "mcp": {\n'
        '    "deepmem": {\n'
        '      "type": "remote",\n'
        f'      "url": "http://127.0.0.1:{port}/mcp",\n'
        '      "enabled": true\n'
        "    }\n"
        "  },\n}\n",
    )
    assert after == expected, init["stdout"] + init["stderr"]
    assert init["deepmem_config"] == f'upstream = [\n  "e2e={upstream}",\n]\n'

    verdict = Verdict(result)
    run = result["runs"][0]
    verdict.check(
        run["returncode"] == 0 and FINAL1 in run["stdout"],
        f"`opencode run` exited {run['returncode']} without {FINAL1!r}:\n{run['stderr_tail']}",
    )
    actions = [r.action for r in verdict.requests if r.plan["kind"] != "title"]
    verdict.check(
        actions == ["read", "bash", "bash", "expand", "final"],
        f"the scripted turn went {actions}",
    )
    # through deepmem: it routed /e2e/ to the fake LLM's /v1, counted the session and
    # compressed the tool outputs the fake LLM then received; its tools were mounted
    verdict.check(
        all(r["path"].startswith("/v1/") for r in result["records"]),
        f"paths: {[r['path'] for r in result['records']]}",
    )
    verdict.check(verdict.stats and verdict.stats["requests"] >= 5, f"/stats: {verdict.stats}")
    verdict.check_mcp_tools()
    verdict.check_compression()
    verdict.check_expand()
    print(
        "\n[deepmem e2e] init: "
        + json.dumps(
            {
                "requests": len(verdict.requests),
                "actions": actions,
                "expand_ok": verdict.expand_ok,
                "isolated_network": result.get("isolated"),
            }
        )
    )
    assert not verdict.problems, "\n- ".join(
        [f"{len(verdict.problems)} problem(s); logs in {result['logs']}", *verdict.problems]
    )
