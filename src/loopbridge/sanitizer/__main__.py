"""``python -m loopbridge.sanitizer`` prints the directory to put first on
PYTHONPATH to activate the sanitizer in processes that never import loopbridge."""

from __future__ import annotations

from . import boot_dir

print(boot_dir())
