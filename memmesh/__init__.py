"""memmesh: a peer-to-peer replicated memory node for AI agents.

The installed package's layers, lowest first (docs/architecture.md): ``memmesh.auth``,
``memmesh.crdt``, ``memmesh.tickets`` and ``memmesh.node``. The repository keeps each in its own
top-level folder; pyproject.toml maps them under this one name so nothing else lands at the top
of site-packages.
"""
