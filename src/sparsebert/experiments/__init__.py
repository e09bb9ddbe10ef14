"""The built-in experiments and search spaces: one module per family, each a plain ``EXPERIMENTS`` dict (and
``SEARCH_SPACES``). They ship inside the package, so an installed ``sparsebert`` finds them outside a checkout;
``sparsebert --experiments PATH`` adds a user's own beside them (see :mod:`sparsebert.config.experiment_registry`)."""
