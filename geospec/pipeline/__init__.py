"""One run of a spec: the run state (``context``), the run directory (``run_dir``), one module
per stage (``stages``) and the loop that runs them (``executor``)."""
