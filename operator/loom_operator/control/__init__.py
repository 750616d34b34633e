"""The operator's clients of what it controls: workers and routers.

`client` calls one worker's control service (`loom_runtime.control_api`) with a token and a
deadline on every call; `probe` asks workers how they are; `router_admin` calls a router's admin
API.
"""
