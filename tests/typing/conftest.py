# The case files are inputs for type checkers, not tests: never import them.
collect_ignore_glob = ["cases/*"]
