"""Contracts between the stages: one owner per fact that several stages share.

Every stage may import from here; nothing here imports a stage (the import-linter contract in
``pyproject.toml``, checked by ``tests/test_architecture.py``). See ``docs/architecture.md``.
"""
