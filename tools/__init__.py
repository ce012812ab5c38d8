"""Set-up tools that the Makefile runs (``python -m tools.bytecode``); nothing here is imported by the app."""
