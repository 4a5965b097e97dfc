"""Recorded runs (``python -m fedlib.records NAME``): the comparisons that the book's default
profile cannot run to convergence, run once at a converged budget with a chapter's data, model and
seeds, their output committed under ``book/records/NAME.json`` (:mod:`fedlib.evaluation.records`)."""
