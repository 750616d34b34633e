"""The router's scorers, one module each; every score is in [0, 1] and higher is better.

The pipeline sums them with the card's weights; a scorer never filters and never picks.
"""
