"""The first turn of the OpenAI-compatible scenario, with OpenCode configured by ``deepmem init``.

Runs like ``tests.e2e.harness`` (``python -m tests.e2e.init_scenario``, inside the private
network namespace when possible), but the user starts with an ``opencode.json`` of their own —
comments, trailing commas, a custom provider whose ``baseURL`` is the fake LLM itself — and
``deepmem init --provider e2e --deepmem-config deepmem.toml`` rewrites it. deepmem is then
started with nothing but that TOML file (``--config``), so the request reaches the fake LLM
only if the upstream ``deepmem init`` wrote is right. One ``opencode run`` (turn 1: read,
bash, bash, deep_expand, answer) goes through the result.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e import harness
from tests.e2e.fake_llm import FakeLLM, Script

PROVIDER = "openai-compatible"

# The user's own config before `deepmem init`: what it must keep byte for byte.
USER_CONFIG = """\
{
  // my OpenCode settings, written by hand
  "$schema": "https://opencode.ai/config.json",
  "autoupdate": false, /* offline */
  "share": "disabled",
  "model": "e2e/fake-model",
  "small_model": "e2e/fake-model",
  "enabled_providers": ["e2e"],
  "provider": {
    "e2e": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "E2E fake LLM",
      "options": {
        "baseURL": "UPSTREAM", // straight to the provider
        "apiKey": "sk-e2e-not-a-secret",
      },
      "models": {
        "fake-model": {
          "name": "Fake Model",
          "tool_call": true,
          "reasoning": true,
          "limit": { "context": 128000, "output": 4096 },
        },
      },
    },
  },
}
"""


class InitScenario(harness.Scenario):
    def __init__(self, opencode: Path, work: Path) -> None:
        super().__init__(PROVIDER, opencode, work)
        self.deepmem_config = work / "deepmem.toml"

    def deepmem_init(self, port: int) -> dict[str, Any]:
        command = [sys.executable, "-m", "proxy", "init", "--provider", "e2e"]
        command += ["--proxy-url", f"http://127.0.0.1:{port}"]
        command += ["--deepmem-config", str(self.deepmem_config)]
        env = dict(self.opencode_env(), PYTHONPATH=str(harness.ROOT))  # OPENCODE_CONFIG set
        done = subprocess.run(
            command,
            cwd=self.repo,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return {
            "returncode": done.returncode,
            "stdout": done.stdout,
            "stderr": done.stderr,
            "config": self.config.read_text(),
            "deepmem_config": (
                self.deepmem_config.read_text() if self.deepmem_config.exists() else None
            ),
        }

    def serve(self, port: int) -> subprocess.Popen[bytes]:
        """deepmem with only the TOML file ``deepmem init`` wrote (no --upstream flags)."""
        arguments = ["--config", str(self.deepmem_config), "--port", str(port)]
        arguments += ["--data-dir", str(self.data), "--allowed-roots", str(self.home)]
        log_path = self.logs / "deepmem.log"
        process = harness.launch_deepmem(arguments, self.home, self.work, log_path, port)
        if process is None:
            raise harness.E2EError(f"deepmem did not become healthy:\n{harness.log_tail(log_path)}")
        return process

    def run(self) -> dict[str, Any]:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.make_repo()
        script = Script(
            read_path=str(self.repo / harness.READ_FILE),
            command=harness.COMMAND,
            small_read_path=str(self.repo / "README.md"),
        )
        with FakeLLM(script) as fake:
            user_config = USER_CONFIG.replace("UPSTREAM", fake.url)
            self.config.write_text(user_config)
            port = harness.free_port()
            init = self.deepmem_init(port)
            if init["returncode"] != 0:
                raise harness.E2EError(f"deepmem init failed: {init['stderr']}")
            deepmem = self.serve(port)
            try:
                runs = [self.run_opencode(1, harness.PROMPTS[0], cont=False)]
                records = fake.dump()
                collected = self.collect(port, records)
            finally:
                harness._stop(deepmem)
        return {
            "provider": self.provider,
            "proxy_port": port,
            "upstream": fake.url,
            "user_config": user_config,
            "init": init,
            "repo": str(self.repo),
            "home": str(self.home),
            "logs": str(self.logs),
            "read_file": harness.READ_FILE,
            "command": harness.COMMAND,
            "runs": runs,
            "records": records,
            **collected,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--provider", choices=[PROVIDER], required=True)
    parser.add_argument("--opencode", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    result = InitScenario(args.opencode, args.work).run()
    (args.work / "result.json").write_text(json.dumps(result, ensure_ascii=False, indent=1))
    print(f"init scenario: runs {[r['returncode'] for r in result['runs']]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
