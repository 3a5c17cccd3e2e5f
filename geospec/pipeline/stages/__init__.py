"""The stages, one module each, in pipeline order (see :data:`geospec.pipeline.executor.STAGES`)."""
