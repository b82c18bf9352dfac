"""Where `Lowered.source_path` writes the emitted source: a private cache.

partir runs generated code from memory (`lowering.loader`) and writes a file
only when asked (`Lowered.source_path`). The file can embed the constants the
function closed over (weights), and a later run may read it, so:

- the directory is per user, mode 0700, and owned by the user. One that
  exists with another owner, a symlink or a non-directory is never used: the
  default location then falls back to a fresh private directory
  (`tempfile.mkdtemp`), and an explicit `$PARTIR_CACHE_DIR` is refused. One
  of ours with a wider mode is narrowed to 0700;
- files are mode 0600, written to a temporary name and renamed into place;
- an existing file is used only if its bytes are the source's (the name is
  only a hash prefix; anything else at that name is replaced).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from dialects.errors import PartirValueError

_fallback: Path | None = None


def _problem(path: Path) -> str | None:
    """Why the existing `path` is not a private directory of ours (None if it is)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    return None


def private_directory(path: Path) -> Path | None:
    """`path` as a private (0700) directory of ours, or None if it cannot be."""
    try:
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        pass
    if _problem(path) is not None:
        return None
    if stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def cache_directory() -> Path:
    """The generated-file directory for this user (see the module docstring)."""
    global _fallback
    explicit = os.environ.get("PARTIR_CACHE_DIR")
    if explicit:
        path = Path(explicit)
        path.parent.mkdir(parents=True, exist_ok=True)
        if private_directory(path) is None:
            raise PartirValueError(
                f"PARTIR_CACHE_DIR={explicit} {_problem(path)}; point it at a directory "
                "of your own (partir makes it mode 0700), or unset it"
            )
        return path
    default = Path(tempfile.gettempdir()) / f"partir-generated-{os.getuid()}"
    if private_directory(default) is not None:
        return default
    if _fallback is None:
        _fallback = Path(tempfile.mkdtemp(prefix="partir-generated-"))
    return _fallback


def write_source(source: str, name: str) -> Path:
    """The path of a 0600 file holding exactly `source` (written if needed)."""
    data = source.encode()
    digest = hashlib.sha256(data).hexdigest()[:16]
    directory = cache_directory()
    path = directory / f"{name}_{digest}.py"
    try:
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid():
            if path.read_bytes() == data:
                if stat.S_IMODE(info.st_mode) != 0o600:
                    os.chmod(path, 0o600)
                return path
    except FileNotFoundError:
        pass
    return write_private(path, data)


def write_private(path: Path, data: str | bytes) -> Path:
    """Write `data` to `path` as a 0600 file: to a temporary name beside it,
    renamed into place (a reader never sees half a file)."""
    raw = data.encode() if isinstance(data, str) else data
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".partir-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp makes it 0600
            f.write(raw)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
