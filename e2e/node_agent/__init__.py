"""The stand-in kubelet: the one test double of Loom's e2e harness, named so everywhere.

It registers Nodes and runs the pods the real scheduler binds to them as local processes on
pod IPs from 127.0.0.0/8; see docs/e2e.md for what it does and does not do.
"""

# Every pod process carries this variable, so `make e2e-down` can find strays of a killed agent.
POD_MARKER = "LOOM_E2E_POD_OF"
