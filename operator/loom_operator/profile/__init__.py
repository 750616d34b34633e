"""`loom profile`: what one worker of a card serves on this machine, measured with real requests
and turned into the card's `autoscaling.capacity` section (docs/autoscaling.md)."""
