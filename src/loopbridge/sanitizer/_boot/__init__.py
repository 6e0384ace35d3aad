"""Holds the ``sitecustomize`` module used to activate the sanitizer in child
interpreters; see ``loopbridge.sanitizer.install_from_env``."""
