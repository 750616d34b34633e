"""Harnesses for tests and benches of a local fleet: `loom up` as a child process, reference
workers, and steady streaming load from the `openai` client (a test dependency).

Never imported by the operator itself.
"""
