"""Helpers the tests import: hand-built plans, tiny corpora, CLI runs, spec planning, fuzz strategies."""
