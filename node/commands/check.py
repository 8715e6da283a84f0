"""check: verify the home (storage file, every entry, derived state, keys); --repair heals it.

The command runs where the home is: through serve when serve runs (verify only: a snapshot of
the storage, read beside serve's own work), otherwise on the home's path, because a damaged
home is exactly what the normal open refuses (``opens_itself`` in the registry). A repair
needs the home to itself: it may rebuild the storage file and moves entries out of the log
that serve's open databases, views and sync links hold in memory, so under serve it is
refused with what to do. The logic is node/integrity/.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from memmesh.node.commands.params import Params
from memmesh.node.commands.registry import EventSink, command
from memmesh.node.commands.result import Result

if TYPE_CHECKING:
    from memmesh.node.library import Node


class Check(Params):
    repair: Annotated[bool, Field(
        description="move damaged entries aside, rebuild the derived state and fetch what is missing from the "
                    "peers that share each database (serve must be stopped)")] = False


@command("check", Check, "verify the home: storage file, every entry's id, payloads and signature, derived state, "
         "keys (exit 1 on damage); --repair heals it from peers", opens_itself=True)
def check(target: Node | Path, p: Check, *, events: EventSink) -> Result:
    """Events: ``{"event": "progress", "bank": "check NAME", "done": n, "total": m, "unit": "entry"}``
    per batch of entries verified."""
    from memmesh.node.integrity import CheckRefused, check_home, check_open

    if isinstance(target, Path):
        report = check_home(target, repair=p.repair, events=events)
    elif p.repair:
        if target.network.serving:
            pid = os.getpid()
            raise CheckRefused(f"check --repair needs the home to itself, and serve (pid {pid}) runs for "
                               f"{target.home}: stop it (kill -TERM {pid}), run memmesh check --repair, then start "
                               "serve again (memmesh check without --repair runs through serve)")
        raise CheckRefused(f"check --repair needs the home to itself, and this node holds {target.home} open: "
                           "close it, then run memmesh check --repair")
    else:
        report = check_open(target, events=events)
    return Result(report.as_dict(), report.text(), exit_code=report.exit_code)
