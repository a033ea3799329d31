"""caper's configuration file: `$XDG_CONFIG_HOME/caper/config.toml`
(default `~/.config/caper/config.toml`; `$CAPER_CONFIG` names another).

    on_unsure = "block"          # what auto does when policy is unsure and no LLM
                                 # is configured: block | allow | ask
    keep_quota_mb = 1024         # held and kept runs, all together, at most this
    keep_quota_inodes_pct = 10   # and at most this share of the state filesystem's inodes

    [report]
    # More credential locations, on top of caper/data/protected.toml.
    protected = [
        { path = "deploy/secrets/**", kind = "deploy-secret" },
        { path = "~/.vault-token", kind = "vault-token" },
    ]

    [policy]
    # Added to the lists of caper/data/policy.toml (same keys).
    harmless_outside = ["~/.my-tool-cache/**"]

    [limits]
    max_memory = "8G"            # the whole sandbox's memory (default: half of RAM,
                                 # at most 8 GiB); also `caper run --max-memory`
    max_events = 1000000         # what one run may cost caper: events it reports
    max_event_bytes = "256M"     # and their bytes; past either the run is blocked

    [network]
    # No network at all unless hosts are allowed (also `caper run --allow-net`):
    # HOST[:PORT], *.DOMAIN[:PORT], or a preset: pypi, npm, crates, goproxy, github.
    # The only ways out are caper's proxy and, by name, its DNS and route
    # (caper.sandbox.netproxy), which record them.
    allow = ["pypi", "npm"]
    [env]
    # The caller's variables whose name (*_TOKEN, *_SECRET, *_KEY, *PASSWORD*,
    # ...) or value (a token's shape) says credential are not passed to the
    # command; these are, as they are (their values are then not redacted).
    allow = ["NPM_TOKEN"]

    [llm]
    protocol = "openai"          # openai (chat completions: OpenAI, Ollama, vLLM,
                                 # llama.cpp) | anthropic (messages)
    base_url = "http://127.0.0.1:11434/v1"
    model = "qwen2.5:7b"
    api_key_env = "OPENAI_API_KEY"   # the variable holding the key (none: no key)
    timeout_s = 20

Environment variables override [llm]: CAPER_LLM_PROTOCOL, CAPER_LLM_BASE_URL,
CAPER_LLM_MODEL, CAPER_LLM_API_KEY, CAPER_LLM_TIMEOUT.

A missing file is an empty configuration; a malformed one is a ConfigError
that names the file and the field.
"""
from __future__ import annotations

import os
import tomllib

from typing import Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from caper.errors import ConfigError
from caper.report.secrets import ProtectedPattern, credential_var, git_env_config, git_env_pair
from caper.sandbox.allowlist import Allowlist


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProtectedEntry(_Strict):
    path: str = Field(min_length=1)
    kind: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")


class ReportConfig(_Strict):
    protected: list[ProtectedEntry] = []


class LimitsConfig(_Strict):
    max_memory: int | None = None     # None: caper.sandbox.limits.DEFAULT_MAX_MEMORY
    max_events: int | None = Field(default=None, gt=0)   # None: DEFAULT_MAX_EVENTS
    max_event_bytes: int | None = None                  # None: DEFAULT_MAX_EVENT_BYTES

    @field_validator("max_memory", "max_event_bytes", mode="before")
    @classmethod
    def _size(cls, v):
        from caper.sandbox.limits import parse_size
        return None if v is None else parse_size(v)

    def trace_kwargs(self) -> dict:
        """The event caps a run's trace() is given (memory goes by its own way)."""
        return {k: v for k, v in (("max_events", self.max_events),
                                  ("max_event_bytes", self.max_event_bytes)) if v}


class NetworkConfig(_Strict):
    allow: list[str] = []

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: list[str]) -> list[str]:
        try:
            Allowlist.parse(v)
        except ConfigError as e:
            raise ValueError(str(e)) from e
        return v

    def allowlist(self, more: "Sequence[str]" = ()) -> Allowlist:
        """These hosts and a run's own (caper run --allow-net)."""
        return Allowlist.parse(self.allow) + Allowlist.parse(more)


class LlmConfig(_Strict):
    protocol: Literal["openai", "anthropic"] = "openai"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    api_key: str | None = None          # prefer api_key_env: config files get shared
    timeout_s: float = Field(default=20.0, gt=0, le=600)
    max_history: int = Field(default=5, ge=0, le=50)

    def with_env(self, env: "dict[str, str]") -> "LlmConfig":
        over: dict = {}
        for key, var in (("protocol", "CAPER_LLM_PROTOCOL"), ("base_url", "CAPER_LLM_BASE_URL"),
                         ("model", "CAPER_LLM_MODEL"), ("api_key", "CAPER_LLM_API_KEY"),
                         ("timeout_s", "CAPER_LLM_TIMEOUT")):
            if env.get(var):
                over[key] = env[var]
        if not over.get("api_key") and not self.api_key and self.api_key_env:
            over["api_key"] = env.get(self.api_key_env)
        try:
            return LlmConfig.model_validate({**self.model_dump(), **over})
        except ValidationError as e:
            raise ConfigError(f"LLM settings from the environment: {_where(e)}",
                              step="config") from e


# caper's own environment variables: never passed to the command it runs.
OWN_ENV_PREFIX = "CAPER_"
class EnvConfig(_Strict):
    # Credential-named or credential-valued variables the command still gets.
    allow: list[str] = []


_POLICY_LISTS = ("harmless_outside", "persistence", "persistence_except", "temp_owned",
                 "formatters", "git_rewrites", "installers", "install_places")


class Config(_Strict):
    on_unsure: Literal["block", "allow", "ask"] = "block"
    # Held runs and conflicting runs' kept versions, all together, at most
    # this size: beyond it a run is not held (or not kept), and says so.
    keep_quota_mb: float = Field(default=1024, ge=0)
    # ... and at most this share (percent) of the state filesystem's inodes:
    # empty files take no space but an inode each.
    keep_quota_inodes_pct: float = Field(default=10, ge=0, le=100)
    report: ReportConfig = ReportConfig()
    policy: dict = {}
    llm: LlmConfig = LlmConfig()
    limits: LimitsConfig = LimitsConfig()
    network: NetworkConfig = NetworkConfig()
    env: EnvConfig = EnvConfig()

    @field_validator("policy")
    @classmethod
    def _policy_lists(cls, v: dict) -> dict:
        for k, items in v.items():
            if k not in _POLICY_LISTS:
                raise ValueError(f"unknown policy list {k!r} (known: {', '.join(_POLICY_LISTS)})")
            if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
                raise ValueError(f"policy.{k} must be a list of strings")
        return v

    def protected_patterns(self) -> list[ProtectedPattern]:
        return [ProtectedPattern(p.path, p.kind) for p in self.report.protected]

    def command_env(self, env: "Mapping[str, str]") -> dict[str, str]:
        """env without caper's own variables and the caller's credentials,
        the command's environment: every CAPER_* (the approver's key and
        settings, the state and config paths), the variable [llm] api_key_env
        names, and every credential_var not in [env] allow; git's environment
        configuration kept whole (secrets.git_env_config). The command is
        what caper judges; its approver's credential is not its to read."""
        own = {self.llm.api_key_env} - {None}
        allow = set(self.env.allow) - own
        return {**{k: v for k, v in env.items() if not k.startswith(OWN_ENV_PREFIX)
                   and k not in own and k != "GIT_CONFIG_COUNT" and not git_env_pair(k)
                   and (k in allow or not credential_var(k, v))},
                **git_env_config(env, allow)}


def config_path(env: "Mapping[str, str] | None" = None) -> str:
    """Where the config file of a caller with this environment lives."""
    env = os.environ if env is None else env
    if env.get("CAPER_CONFIG"):
        return env["CAPER_CONFIG"]
    home = env.get("HOME") or os.path.expanduser("~")
    base = env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    return os.path.join(base, "caper", "config.toml")


def load_config(path: str | None = None, env: "Mapping[str, str] | None" = None) -> Config:
    path = path or config_path(env)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            # It widens what the policy lets through: only the user's (or root's) own file.
            if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
                raise ConfigError(f"config {path}: owned by uid {st.st_uid} with mode "
                                  f"{st.st_mode & 0o7777:04o}; caper reads only a file of yours "
                                  f"that nobody else can write (chmod go-w {path})",
                                  step="config")
            data = tomllib.load(f)
    except FileNotFoundError:
        return Config()
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config {path}: {e}", step="config") from e
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"config {path}: {_where(e)}", step="config") from e


def _where(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
