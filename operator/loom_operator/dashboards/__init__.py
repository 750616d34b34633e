"""Loom's Grafana dashboards, built from code with grafana-foundation-sdk: one module per
dashboard, `files.py` turns them into the JSON the Helm chart ships (`make dashboards`).

Pure builders: they read no cluster, no Prometheus and no files, and never import kopf or
kubernetes. Every query names only metrics the runtime or the router export (vLLM's names where
Loom exports them, so vLLM dashboards keep working); tests/operator/dashboards proves each one
returns series from a real Prometheus scraping a live fleet.
"""
