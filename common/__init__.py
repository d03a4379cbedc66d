"""Helpers every layer may use; this package imports no app of the project (DESIGN.md
"Layout": the leaf of shared helpers)."""
