"""The release: one number, read by the package (``geospec.__version__``), ``geospec --version`` and
every record geospec writes (run metadata, exported models, the builtin plugins' provenance).

It has a module of its own, below everything, so that no module inside geospec imports the
package's ``__init__`` (which imports the registry for ``hookimpl``): that would be a loop.
"""

__version__ = "0.2.0"
