"""The real agent CLIs, pinned, installed from npm, each run with a HOME of
its own against tests/agents/model_server.py.

    python tests/agents/clients.py install     (bootstrap runs it)

installs them under $CAPER_AGENTS_DIR, default .cache/agents in the
checkout. The tests install them on first use the same way, and skip (with
npm's own words) only when the registry cannot be reached.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PINS = {"claude-code": "@anthropic-ai/claude-code@2.1.197",
        "codex": "@openai/codex@0.171.0",
        "gemini": "@google/gemini-cli@0.61.0"}
BINARIES = {"claude-code": "claude", "codex": "codex", "gemini": "gemini"}
PROTOCOLS = {"claude-code": "anthropic", "codex": "openai", "gemini": "gemini"}
CLIENT_TIMEOUT_S = 180
# npm's words when the registry is out of reach (as opposed to a broken install).
UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET",
               "ENETUNREACH", "network request", "proxy")


class Unreachable(Exception):
    """npm could not reach the registry."""


def agents_dir() -> Path:
    return Path(os.environ.get("CAPER_AGENTS_DIR") or ROOT / ".cache" / "agents")


def binary(agent: str) -> Path:
    return agents_dir() / "node_modules" / ".bin" / BINARIES[agent]


def installed_version(agent: str) -> str | None:
    name = PINS[agent].rsplit("@", 1)[0]
    try:
        return json.loads((agents_dir() / "node_modules" / name / "package.json").read_text())[
            "version"]
    except (OSError, ValueError, KeyError):
        return None


def install() -> None:
    """npm install of the pins that are missing; Unreachable if npm cannot
    reach the registry, RuntimeError (npm's output) for any other failure."""
    missing = [spec for agent, spec in PINS.items()
               if installed_version(agent) != spec.rsplit("@", 1)[1] or not binary(agent).exists()]
    if not missing:
        return
    agents_dir().mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["npm", "install", "--prefix", str(agents_dir()), "--no-audit", "--no-fund",
                        "--no-save", *missing], capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        words = (p.stdout + p.stderr).strip()
        if any(w in words for w in UNREACHABLE):
            raise Unreachable(f"npm install {' '.join(missing)}: {words[-600:]}")
        raise RuntimeError(f"npm install {' '.join(missing)} failed ({p.returncode}):\n{words}")


def install_or_skip() -> None:
    """install(), or skip the calling test with the reason it cannot run."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed: cannot install the agent CLIs")
    try:
        install()
    except Unreachable as e:
        pytest.skip(f"the npm registry cannot be reached: {e}")


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


class Client:
    """One agent CLI with its own HOME under `root`, talking to `model`."""

    def __init__(self, agent: str, root: Path, model, extra_env: dict | None = None):
        self.agent, self.model = agent, model
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        # The hooks and the wrapped commands run this checkout's caper, as
        # the test process does.
        self.env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                    "HOME": str(self.home), "LANG": "C.UTF-8", "TERM": "dumb",
                    "PYTHONPATH": str(ROOT), "CAPER_NO_GATE": "1",
                    "CAPER_STATE_DIR": str(root / "state"), **(extra_env or {})}
        getattr(self, "_setup_" + agent.replace("-", "_"))()

    def _setup_claude_code(self):
        (self.home / ".claude.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
        self.env.update(ANTHROPIC_BASE_URL=self.model.url, ANTHROPIC_API_KEY="sk-ant-test",
                        DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                        DISABLE_AUTOUPDATER="1")

    def _setup_codex(self):
        codex_home = self.home / ".codex"
        codex_home.mkdir(exist_ok=True)
        (codex_home / "config.toml").write_text(
            'model = "gpt-5"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
            f'base_url = "{self.model.url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_KEY"\n'
            "request_max_retries = 0\nstream_max_retries = 0\n\n[features]\n"
            "enable_request_compression = false\n")
        self.env.update(CODEX_HOME=str(codex_home), FAKE_KEY="test")

    def _setup_gemini(self):
        (self.home / ".gemini").mkdir(exist_ok=True)
        (self.home / ".gemini" / "settings.json").write_text(json.dumps(
            {"security": {"auth": {"selectedType": "gemini-api-key"}},
             "privacy": {"usageStatisticsEnabled": False}}))
        self.env.update(GOOGLE_GEMINI_BASE_URL=self.model.url, GEMINI_API_KEY="test",
                        GEMINI_CLI_TRUST_WORKSPACE="true")

    def argv(self, prompt: str, *extra: str) -> list[str]:
        exe = str(binary(self.agent))
        if self.agent == "claude-code":
            return [exe, "-p", prompt, "--output-format", "json", *extra]
        if self.agent == "codex":
            return [exe, "exec", "--skip-git-repo-check", "-s", "danger-full-access", "--json",
                    *extra, prompt]
        return [exe, "--yolo", "-m", "gemini-2.5-flash", *extra, "-p", prompt]

    def run(self, prompt: str, cwd: Path, *extra: str, timeout: float = CLIENT_TIMEOUT_S) -> Run:
        p = subprocess.run(self.argv(prompt, *extra), cwd=cwd, env=self.env, capture_output=True,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return Run(p.returncode, p.stdout, p.stderr)

    def caper(self, *args: str, cwd: Path, python: str = sys.executable
              ) -> subprocess.CompletedProcess:
        """`caper ARGS` as this client's user would type it."""
        return subprocess.run([python, "-m", "caper", *args], cwd=cwd, env=self.env,
                              capture_output=True, text=True, timeout=120)

    def codex_hooks(self, cwd: Path) -> list[dict]:
        """The hooks Codex itself sees for cwd, with their trust status
        (`codex app-server`'s hooks/list, JSON-RPC on stdio)."""
        p = subprocess.Popen([str(binary("codex")), "app-server"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
                             text=True)
        try:
            for msg in ({"id": 1, "method": "initialize",
                         "params": {"clientInfo": {"name": "caper-tests", "version": "1"}}},
                        {"method": "initialized"},
                        {"id": 2, "method": "hooks/list", "params": {"cwds": [str(cwd)]}}):
                p.stdin.write(json.dumps(msg) + "\n")
            p.stdin.flush()
            for _ in range(1000):          # notifications may come first
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError("codex app-server closed without answering hooks/list")
                doc = json.loads(line)
                if doc.get("id") == 2:
                    return [h for entry in doc["result"]["data"] for h in entry["hooks"]]
            raise RuntimeError("codex app-server: no answer to hooks/list")
        finally:
            p.kill()
            p.wait()


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: clients.py install")
    try:
        install()
    except Unreachable as e:
        print(f"warning: the agent CLIs were not installed (the e2e tests will skip): {e}",
              file=sys.stderr)
    for a in PINS:
        print(f"{a}: {installed_version(a)} at {binary(a)}")
