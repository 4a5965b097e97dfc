"""Evaluation: metrics, statistics and reporting, the claims ledger, the papers' printed tables."""
