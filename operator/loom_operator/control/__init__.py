"""The operator's side of the worker control contract (`loom_runtime.control_api`).

`client` calls one worker's control service with a token and a deadline on every call.
"""
