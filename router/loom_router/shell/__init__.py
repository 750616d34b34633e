"""The router's shell: the OpenAI proxy, the attempt loop, upstream calls, admin API, KV-event
subscriber, scraper and prober, and the process that wires them.

Does the I/O around the core's decisions; never decides where a request goes (core does).
"""
