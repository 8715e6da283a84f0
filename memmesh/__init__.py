"""memmesh: a peer-to-peer replicated memory node for AI agents.

The installed package's layers, lowest first (docs/architecture.md): ``memmesh.auth``,
``memmesh.crdt``, ``memmesh.tickets`` and ``memmesh.node``. The repository keeps each in its own
top-level folder; this package links to each, so they install under this one name and nothing
else lands at the top of site-packages.
"""
