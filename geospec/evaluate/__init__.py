"""Downstream evaluation of trained arms with lm-evaluation-harness (the ``eval`` extra):
``harness`` runs named tasks on an exported checkpoint, ``tasks`` holds the bundled offline task
(a last-word task on held-out Austen text)."""
