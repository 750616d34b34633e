"""MTP speculative decoding: whether an engine may speculate, the MTP layer's runner, the executor
that drafts, verifies and keeps what the verdict accepts, the acceptance rules, and the
one-sequence reference they are checked against.

Owns speculation; never schedules (the batcher does) and never changes a block table.
"""
