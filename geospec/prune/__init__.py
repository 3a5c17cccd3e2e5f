"""Pruning a pretrained checkpoint's FFNs to a budget: every arm's widths at the pruned budget
(``allocate``), the cut models' held-out losses and their export (``apply``)."""
