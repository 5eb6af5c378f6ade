"""The ``toolfleet`` command line (``main``) and its console script (``entry``).

Importing this package loads nothing of the ``worker`` extra: :mod:`.entry` must run
without click to print what to install.
"""
