"""Files on disk written and read safely: atomic writes (:mod:`~geospec.storage.atomic`), a full
disk recognised wherever geospec writes (:mod:`~geospec.storage.disk`), advisory locks
(:mod:`~geospec.storage.locks`) and content hashes (:mod:`~geospec.storage.digests`)."""
