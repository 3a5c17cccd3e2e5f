"""The example specs, shipped inside geospec as package data (``geospec.specs``).

``geospec run tiny`` (any command taking a SPEC) runs ``tiny.toml`` from here when no file of
that name is in the current directory, so a non-editable install has the embedded default too.
"""
