"""``GET /metrics``: the status command's numbers in the Prometheus text format 0.0.4.

Rendered from the data `memmesh status` returns (node/commands/node_status.py), run through
serve's command runner like any other command, so a scrape and the page and the CLI never
count a thing two ways. Written by hand rather than with prometheus_client: the format is a
few lines of text, and that library's model (process-global collectors that are updated as
things happen) is the second way of counting this module exists to avoid.

Metric names (docs/api.md, "Events, metrics and health"): see ``render``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from memmesh.node.events import source_of

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Family:
    def __init__(self, name: str, kind: str, help_: str) -> None:
        self.name, self.kind, self.help = name, kind, help_
        self.samples: dict[tuple[tuple[str, str], ...], float] = {}

    def add(self, value: float | int | None, **labels: Any) -> None:
        if value is None:
            return
        key = tuple(sorted((k, "" if v is None else str(v)) for k, v in labels.items()))
        self.samples[key] = self.samples.get(key, 0) + float(value)  # a repeated label set sums

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {_escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in sorted(self.samples.items()):
            inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
            yield f"{self.name}{{{inner}}} {_number(value)}" if inner else f"{self.name} {_number(value)}"


def render(status: dict[str, Any]) -> str:
    """The exposition text of ``status`` (the status command's data)."""
    node = status.get("node") or {}
    uptime = _Family("memmesh_uptime_seconds", "gauge", "seconds since this serve started")
    verified = _Family("memmesh_verify_entries_total", "counter", "entry signatures verified since serve started")
    verify_rate = _Family("memmesh_verify_entries_per_second", "gauge", "entry signatures verified per second, "
                                                                         "recently")
    entries = _Family("memmesh_entries", "gauge", "entries stored in the database")
    pending = _Family("memmesh_pending_entries", "gauge", "entries waiting for parents or payloads")
    refused = _Family("memmesh_entries_refused_total", "counter",
                      "entries refused, by the peer that sent them (or local) and the reason")
    accepted = _Family("memmesh_entries_accepted_total", "counter",
                       "entries this node stored from the peer in its exchanges with it")
    pushed = _Family("memmesh_entries_pushed_total", "counter", "entries the peer stored from this node")
    lag = _Family("memmesh_lag_entries", "gauge", "entries one side lacks (direction peer_lacks or we_lack), "
                                                  "exact, from feed positions")
    stale = _Family("memmesh_bank_stale", "gauge", "1 when a peer of the bank has not completed an exchange "
                                                   "for longer than sync.stale_after_s")

    uptime.add(node.get("uptime_s"))
    verify = node.get("verify") or {}
    verified.add(verify.get("entries"))
    verify_rate.add(verify.get("per_s"))
    for d in status.get("databases", []):
        db, bank = d.get("id"), d.get("name")
        entries.add(d.get("entries"), db=db, bank=bank)
        pending.add(d.get("pending"), db=db, bank=bank)
        for source, reasons in (d.get("refused") or {}).items():
            for reason, n in reasons.items():
                refused.add(n, db=db, bank=bank, peer=source_of(source), reason=reason)
        sync = d.get("sync") or {}
        if "stale" in sync:
            stale.add(int(bool(sync["stale"])), db=db, bank=bank)
        for p in sync.get("peers", []):
            lag.add(p.get("peer_lacks"), db=db, bank=bank, peer=p.get("peer"), direction="peer_lacks")
            lag.add(p.get("we_lack"), db=db, bank=bank, peer=p.get("peer"), direction="we_lack")
    for link in (status.get("sync") or {}).get("links", []):
        accepted.add(link.get("pulled"), db=link.get("db"), bank=link.get("bank"), peer=link.get("peer"))
        pushed.add(link.get("pushed"), db=link.get("db"), bank=link.get("bank"), peer=link.get("peer"))
    families = (uptime, verified, verify_rate, entries, pending, accepted, pushed, refused, lag, stale)
    return "\n".join(line for f in families for line in f.lines()) + "\n"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)
