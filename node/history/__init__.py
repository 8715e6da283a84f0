"""Conversation history: the raw record, the chunk pyramid, the context window, history search.

See docs/memory.md, "History". Modules: record (rows), summary (extractive summaries),
pyramid (chunks of a session), state (a database's rows, followed), window, search, service
(the operations the commands run).
"""
