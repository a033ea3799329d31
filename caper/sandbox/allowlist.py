"""What a run may reach on the network: host names with optional ports and
wildcards, and named presets for the common registries (`--allow-net`,
`[network] allow`). Read by the proxy and by the DNS responder."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from caper.errors import ConfigError

PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org:443", "files.pythonhosted.org:443"),
    "npm": ("registry.npmjs.org:443", "registry.yarnpkg.com:443"),
    "crates": ("crates.io:443", "index.crates.io:443", "static.crates.io:443"),
    "goproxy": ("proxy.golang.org:443", "sum.golang.org:443", "storage.googleapis.com:443"),
    "github": ("github.com:443", "codeload.github.com:443", "objects.githubusercontent.com:443",
               "gitlab.com:443"),
}
LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"   # one label of a host name
_RULE = re.compile(rf"(\*\.)?({LABEL}(?:\.{LABEL})*)(?::([0-9]{{1,5}}))?")


@dataclass(frozen=True, slots=True)
class AllowRule:
    host: str                 # lower case; "*.example.com" matches its subdomains
    port: int | None = None   # None: any port

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    def __str__(self) -> str:
        return self.host + (f":{self.port}" if self.port is not None else "")


@dataclass(frozen=True, slots=True)
class Allowlist:
    rules: tuple[AllowRule, ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str]) -> "Allowlist":
        """HOST[:PORT] entries (a leading "*." for subdomains) and preset names
        (PRESETS); a ConfigError names the first bad entry."""
        rules: list[AllowRule] = []
        for item in items:
            text = item.strip().lower() if isinstance(item, str) else item
            if text in PRESETS:
                rules += [cls.parse([r]).rules[0] for r in PRESETS[text]]
                continue
            m = _RULE.fullmatch(text) if isinstance(text, str) else None
            port = int(m.group(3)) if m and m.group(3) else None
            if not m or (port is not None and not 0 < port < 65536):
                raise ConfigError(f"--allow-net {item!r}: not HOST[:PORT], *.DOMAIN[:PORT] or a "
                                  f"preset ({', '.join(PRESETS)})")
            rules.append(AllowRule((m.group(1) or "") + m.group(2), port))
        return cls(tuple(dict.fromkeys(rules)))

    def __add__(self, other: "Allowlist") -> "Allowlist":
        return Allowlist(tuple(dict.fromkeys(self.rules + other.rules)))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def allows(self, host: str, port: int) -> bool:
        return any(r.matches(host, port) for r in self.rules)

    def names(self) -> list[str]:
        return [str(r) for r in self.rules]
