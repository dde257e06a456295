"""Kubernetes API schemas made strict for offline checks of generated manifests."""

from __future__ import annotations


def strict_schema(schema):
    """The schema with unknown fields refused (the API server would prune them silently: a typo)."""
    if isinstance(schema, dict):
        out = {k: strict_schema(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict_schema(v) for v in schema]
    return schema
