"""The MoT family (a mixture-of-transformers, BAGEL/Transfusion shape): one llama transformer stack
whose weights decode text over the paged KV and denoise image latents that attend to that KV.

Pure compute and its tiny checkpoint; never schedules steps or requests.
"""
