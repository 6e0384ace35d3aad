"""Hard-link the files a new venv has in common with the tree's other venvs.

    python3 scripts/share-venv-files.py NEW_VENV OTHER_VENV... [--dry-run]

Every supported engine release has a venv of its own, and most of their bytes are the
same files: vLLM 0.33 and 0.34 install the same torch and CUDA libraries, SGLang's
torch has the same CUDA libraries, 0.29 and 0.32 the same CPU torch. A file of
NEW_VENV's site-packages is replaced by a hard link to the file at the same path in
another venv's site-packages when the two are byte for byte the same; a file that
differs, is small, or is a link already is left as it is. Nothing else changes: pip
replaces a file by unlinking it, never by writing into it, so an upgrade in one venv
does not reach the other. Only venvs whose setup finished (scripts/setup.sh writes
their `.loopbridge-deps` stamp last) are linked to, so a venv still being installed
is never read. Prints one line: how many files and bytes are now shared.
"""

from __future__ import annotations

import filecmp
import os
import sys
from pathlib import Path

SMALLEST = 256 * 1024  # below this the saving is not worth the comparison


def site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def share(new: Path, others: list[Path], *, dry_run: bool) -> tuple[int, int]:
    """Link NEW's files to identical ones in OTHERS; return (files, bytes) shared."""
    new_site = site_packages(new)
    if new_site is None:
        return 0, 0
    other_sites: list[Path] = []
    for venv in others:
        site = site_packages(venv)
        if site is None or venv.resolve() == new.resolve():
            continue
        finished = (venv / ".loopbridge-deps").is_file()
        if finished and site.parent.name == new_site.parent.name:  # the same Python
            other_sites.append(site)
    if not other_sites:
        return 0, 0
    files = saved = 0
    for root, _dirs, names in os.walk(new_site):
        for name in names:
            path = Path(root, name)
            stat = path.lstat()
            if not path.is_file() or path.is_symlink() or stat.st_size < SMALLEST:
                continue
            relative = path.relative_to(new_site)
            for site in other_sites:
                twin = site / relative
                try:
                    twin_stat = twin.lstat()
                except FileNotFoundError:
                    continue
                if (twin_stat.st_dev, twin_stat.st_ino) == (stat.st_dev, stat.st_ino):
                    break  # shared already
                if twin_stat.st_size != stat.st_size or twin_stat.st_dev != stat.st_dev:
                    continue
                if not twin.is_file() or not filecmp.cmp(path, twin, shallow=False):
                    continue
                if not dry_run:
                    staged = path.with_name(f".{name}.shared")
                    os.link(twin, staged)
                    os.replace(staged, path)
                files += 1
                saved += stat.st_size
                break
    return files, saved


def main(argv: list[str]) -> int:
    dry_run = "--dry-run" in argv
    venvs = [Path(a) for a in argv if a != "--dry-run"]
    if not venvs:
        print(__doc__, file=sys.stderr)
        return 2
    files, saved = share(venvs[0], venvs[1:], dry_run=dry_run)
    verb = "would share" if dry_run else "shares"
    print(f"setup: {venvs[0]} {verb} {files} files ({saved / 2**30:.1f} GiB) with the other venvs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
