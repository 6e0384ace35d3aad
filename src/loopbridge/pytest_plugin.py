"""pytest plugin for loopbridge (extended by the sanitizer)."""
