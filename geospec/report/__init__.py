"""The report: results from the run directory's records (``results``), paired statistics
(``stats``), report.md (``markdown``), figures (``plots``), terminal tables (``terminal``) and the
diagnostics section (``diagnostics``)."""
