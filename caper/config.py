"""caper's configuration file: `$XDG_CONFIG_HOME/caper/config.toml`
(default `~/.config/caper/config.toml`; `$CAPER_CONFIG` names another).

    [report]
    # More credential locations, on top of caper/data/protected.toml.
    protected = [
        { path = "deploy/secrets/**", kind = "deploy-secret" },
        { path = "~/.vault-token", kind = "vault-token" },
    ]

A missing file is an empty configuration; a malformed one is a ConfigError
that names the file and the field.
"""
from __future__ import annotations

import os
import tomllib

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caper.errors import ConfigError
from caper.secrets import ProtectedPattern


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProtectedEntry(_Strict):
    path: str = Field(min_length=1)
    kind: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")


class ReportConfig(_Strict):
    protected: list[ProtectedEntry] = []


class Config(_Strict):
    report: ReportConfig = ReportConfig()

    def protected_patterns(self) -> list[ProtectedPattern]:
        return [ProtectedPattern(p.path, p.kind) for p in self.report.protected]


def config_path() -> str:
    if os.environ.get("CAPER_CONFIG"):
        return os.environ["CAPER_CONFIG"]
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "caper", "config.toml")


def load_config(path: str | None = None) -> Config:
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return Config()
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"config {path}: {e}", step="config") from e
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        where = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"config {path}: {where}", step="config") from e
