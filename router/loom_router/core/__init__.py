"""The router's pure core: filters, scorers, the endpoint picker, prefix indexes, P/D decision.

Plain data in, decisions out; never does I/O (no HTTP, ZMQ or sockets: an import contract says
so), never reads a clock it was not given.
"""
