"""Prompt packs (packs spec): pack files and their lock, repositories and sources, the catalog, the evaluation.

Pure Python: nothing here imports torch, trio or the engine (an import-linter contract holds it), so a pack author's
`spinf-serve packs validate` and the evaluator run anywhere.
"""
