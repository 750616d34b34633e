"""The wan family (Wan 2.x shape): the video DiT, its UMT5 text encoder, the causal 3D VAE decoder.

Pure compute and diffusers-format checkpoint loading; never schedules denoise steps or requests.
"""
