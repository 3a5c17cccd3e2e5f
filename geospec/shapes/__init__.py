"""A model's size from its shape alone, without torch or a built model: parameters
(:mod:`~geospec.shapes.model_size`) and training memory (:mod:`~geospec.shapes.memory`)."""
