"""Pruning a pretrained checkpoint's FFNs to a budget, a step a module in the order a prune flows
(docs/architecture.md, "prune/, in the order a prune flows"): the loop over the units (``study``)
reads the unpruned model (``unpruned``), its arms (``arms``) and each calibration sample
(``calibration``, ``score``); each unit is allocated (``allocate``, ``search``, ``evolve``,
``unit_search``), cut and repaired (``cut``, ``repair``, ``heal``) and measured (``unit_result``,
``losses``); then prune.json is recorded (``record``), the recommendation selected (``select``),
shipped (``shipped``, ``shipped_score``) and exported (``unit_export``, ``hf_export``,
``exports``, ``gguf_export``)."""
