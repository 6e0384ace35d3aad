"""Holds the ``sitecustomize`` module used to activate the sanitizer in child
interpreters; see ``loopbridge._sanitizer.install_from_env``."""
