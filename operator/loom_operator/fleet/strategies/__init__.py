"""Weight-sync strategies (DeploymentCard `weightSync.strategy`), one module each.

`registry.py` maps a card's strategy name to its object; `sync.py` asks that object, never the name.
"""
