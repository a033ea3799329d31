"""caper.sandbox.netdns: the sandbox's name service, when the run allows hosts.

Every host name the allowlist names (a wildcard rule counts as one) gets an address of
its own in ROUTE_NET, on the sandbox's loopback, where caper listens on the rule's ports
(80 and 443 for a rule without one): that answer is the transparent route of tools that
ignore the proxy variables (caper.sandbox.netproxy). caper's DNS, a UDP socket at each
IPv4 name server the sandbox's /etc/resolv.conf names, answers A queries for allowed
names with that address, other types of an allowed name with no records, and every
other name with NXDOMAIN. Nothing is asked upstream: what a name really resolves to is
looked up by caper on the host side when a connection to it is made, so the sandbox
never learns, or chooses, an address outside it. Every query becomes a DnsQuery.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from caper.sandbox.allowlist import Allowlist

DNS_PORT = 53
ROUTE_NET = ipaddress.IPv4Network("127.83.0.0/16")   # the routes' addresses, one per name
ROUTE_PORTS = (80, 443)       # a rule without a port is routed on these
RESOLV_CONF = "/etc/resolv.conf"
MAX_NAMESERVERS = 3           # glibc's MAXNS: the resolver asks no more
TTL_S = 60
_TYPES = {1: "A", 2: "NS", 5: "CNAME", 6: "SOA", 12: "PTR", 15: "MX", 16: "TXT", 28: "AAAA",
          33: "SRV", 65: "HTTPS", 255: "ANY"}
NOERROR, FORMERR, NXDOMAIN, NOTIMP = 0, 1, 3, 4


@dataclass(slots=True)
class DnsQuery:
    """One distinct query to caper's DNS (repeats counted) and its answer."""
    name: str
    qtype: str                     # A, AAAA, ... or the number
    answer: str                    # the address given, "no records" or "NXDOMAIN"
    allowed: bool
    count: int = 1
    pid: int | None = None         # the process that asked (its connect to the server), and
    seq: int | None = None         # that connect's event; None when caper cannot tell


@dataclass(frozen=True, slots=True)
class Route:
    """An allowed name (or wildcard) and the sandbox address caper answers for it."""
    host: str                      # as the rule says: "pypi.org", "*.example.com"
    address: str
    ports: tuple[int, ...]


def routes(allow: "Allowlist") -> tuple[Route, ...]:
    """One route per host name the allowlist names; address literals need none."""
    ports: dict[str, set[int]] = {}
    for r in allow.rules:
        if not literal(r.host):
            ports.setdefault(r.host, set()).update(ROUTE_PORTS if r.port is None else (r.port,))
    hosts = list(ports)
    return tuple(Route(h, str(ROUTE_NET[i + 1]), tuple(sorted(ports[h])))
                 for i, h in enumerate(hosts))


def route_for(routes_: tuple[Route, ...], name: str) -> Route | None:
    """The route a name resolves to: its own, else the longest wildcard over it."""
    name = name.lower().rstrip(".")
    exact = next((r for r in routes_ if r.host == name), None)
    if exact:
        return exact
    wild = [r for r in routes_ if r.host.startswith("*.") and name.endswith(r.host[1:])]
    return max(wild, key=lambda r: len(r.host), default=None)


def nameservers(path: str = RESOLV_CONF) -> tuple[str, ...]:
    """The IPv4 name servers the sandbox's resolvers ask (it sees the host's
    /etc/resolv.conf); 127.0.0.1 when it names none, as glibc does."""
    found: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    try:
                        addr = ipaddress.ip_address(parts[1])
                    except ValueError:
                        continue
                    if addr.version == 4 and str(addr) not in found:
                        found.append(str(addr))
    except FileNotFoundError:
        pass
    return tuple(found[:MAX_NAMESERVERS]) or ("127.0.0.1",)


def literal(host: str) -> bool:
    """An address, not a name (an allow rule may name one)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Question:
    id: int
    flags: int
    name: str                      # lower case, no trailing dot
    qtype: int
    qclass: int
    wire: bytes                    # the question section as sent (its letter case kept)

    @property
    def type_name(self) -> str:
        return _TYPES.get(self.qtype, str(self.qtype))


def parse(msg: bytes) -> Question:
    """The one question of a standard query; ValueError for anything else."""
    if len(msg) < 12:
        raise ValueError("shorter than a DNS header")
    qid, flags, qd = struct.unpack("!HHH", msg[:6])
    if flags & 0x8000 or qd != 1:
        raise ValueError("not a query with one question")
    i, labels = 12, []
    while True:
        if i >= len(msg):
            raise ValueError("name runs past the message")
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 or i + 1 + n > len(msg):
            raise ValueError("compressed or cut label in a question")
        labels.append(msg[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    if i + 4 > len(msg) or i > 12 + 255:
        raise ValueError("question cut short or name too long")
    qtype, qclass = struct.unpack("!HH", msg[i:i + 4])
    return Question(qid, flags, ".".join(labels).lower(), qtype, qclass, msg[12:i + 4])


def reply(q: Question, rcode: int, address: str | None = None) -> bytes:
    """The response: rcode, and an A record for address when given."""
    flags = 0x8000 | (q.flags & 0x7800) | 0x0400 | (q.flags & 0x0100) | 0x0080 | rcode
    out = struct.pack("!HHHHHH", q.id, flags, 1, 1 if address else 0, 0, 0) + q.wire
    if address:
        out += struct.pack("!HHHIH", 0xC00C, 1, 1, TTL_S, 4) + ipaddress.IPv4Address(address).packed
    return out


def error_reply(msg: bytes, rcode: int) -> bytes | None:
    """FORMERR/NOTIMP for a message parse() refused, echoing its id; None when
    not even a header came (nothing to answer)."""
    if len(msg) < 12 or msg[2] & 0x80:
        return None
    qid, flags = struct.unpack("!HH", msg[:4])
    return struct.pack("!HHHHHH", qid, 0x8000 | (flags & 0x7900) | 0x0080 | rcode, 0, 0, 0, 0)
