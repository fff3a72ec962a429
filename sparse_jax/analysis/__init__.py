"""Analyses of built models that need no training: parameter and storage accounting."""

from sparse_jax.analysis.storage import storage_report

__all__ = ["storage_report"]
