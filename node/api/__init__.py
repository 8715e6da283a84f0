"""The local HTTP API (docs/api.md): served by `memmesh serve` next to the sync API.

    routes.py    the route table, derived from the command registry
    app.py       the aiohttp application: bearer token, body rules, one command per request
    errors.py    the one table from exception classes to HTTP status and stable error code
    openapi.py   the OpenAPI 3.1 document, built from the same route table and models
    token.py     HOME/api.token (mode 0600)
    address.py   where the API listens (loopback only unless config.yaml allows otherwise)

This package imports nothing heavy at import time, so that node/home.py can create the token
at `init` without loading aiohttp.
"""
