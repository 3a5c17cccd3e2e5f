"""The model, its data and its training: everything that needs torch to build or train a model.

``model``/``model_size`` the decoder and its parameter count; ``pretrained`` Hugging Face
checkpoints; ``corpus``/``tokenizer``/``token_data``/``batches`` text to token windows;
``train``/``compiling``/``checkpoint``/``distributed``/``progress`` one training run.
"""
