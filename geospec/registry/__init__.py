"""Plugin machinery: the hooks (``hookspecs``), what a registry holds (``entries``) and how the
registries are built from the builtins and installed packages (``loading``)."""
