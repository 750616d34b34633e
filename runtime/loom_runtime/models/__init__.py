"""Model families in plain torch and their checkpoint loaders.

Pure compute over explicit inputs; never schedules or owns KV memory.
"""
