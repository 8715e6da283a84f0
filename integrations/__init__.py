"""memmesh's integrations with agent frameworks, the top floor of the package: each module
builds on the library (``memmesh.node.connect``) and the framework it serves, which is an extra
(``pip install 'memmesh[langgraph]'`` for :mod:`memmesh.integrations.langgraph`).

Nothing below imports this package; docs/integrations.md describes each integration.
"""
