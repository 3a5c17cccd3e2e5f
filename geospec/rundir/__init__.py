"""The run directory's records, below every package that writes or reads them: every name in it
(:mod:`~geospec.rundir.layout`), the one reader of its JSON artifacts
(:mod:`~geospec.rundir.artifacts`) and the records the pipeline writes and the report reads
(:mod:`~geospec.rundir.records`)."""
