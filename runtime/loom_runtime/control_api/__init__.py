"""The worker control contract: `control.proto` and its generated stubs (`make proto`).

Shared by the runtime (which serves it) and the operator (which calls it), so there is one copy
of the messages. Imports only protobuf and grpc.
"""
