"""`Lowered.source_path`: a private per-user cache, used only when the content matches."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

import partir
from partir import generated_files


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("PARTIR_CACHE_DIR", str(path))
    return path


def test_directory_0700_and_file_0600(cache):
    path = generated_files.write_source("print(1)\n", "prog")
    assert path.parent == cache and _mode(cache) == 0o700 and _mode(path) == 0o600
    assert path.read_text() == "print(1)\n"


def test_a_file_with_the_expected_name_but_other_content_is_replaced(cache):
    first = generated_files.write_source("x = 1\n", "prog")
    first.write_text("import os; os.system('evil')\n")  # planted under the same name
    again = generated_files.write_source("x = 1\n", "prog")
    assert again == first and again.read_text() == "x = 1\n" and _mode(again) == 0o600


def test_a_symlink_in_place_of_the_file_is_replaced_not_followed(cache, tmp_path):
    path = generated_files.write_source("y = 2\n", "prog")
    target = tmp_path / "elsewhere.py"
    target.write_text("y = 2\n")
    path.unlink()
    path.symlink_to(target)
    again = generated_files.write_source("y = 2\n", "prog")
    assert not again.is_symlink() and again.read_text() == "y = 2\n"


def test_a_wider_directory_of_ours_is_narrowed(cache):
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    generated_files.write_source("z = 3\n", "prog")
    assert _mode(cache) == 0o700


def test_an_explicit_directory_that_is_a_symlink_is_refused(cache, tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    cache.symlink_to(real)
    with pytest.raises(partir.PartirValueError, match=r"PARTIR_CACHE_DIR=.* is a symbolic link"):
        generated_files.write_source("w = 4\n", "prog")


def test_the_default_directory_is_per_user_and_falls_back_when_taken(tmp_path, monkeypatch):
    monkeypatch.delenv("PARTIR_CACHE_DIR", raising=False)
    monkeypatch.setattr(generated_files.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(generated_files, "_fallback", None)
    taken = tmp_path / f"partir-generated-{os.getuid()}"
    taken.write_text("not a directory")  # as if someone else had taken the name
    path = generated_files.write_source("v = 5\n", "prog")
    assert path.parent != taken and _mode(path.parent) == 0o700 and _mode(path) == 0o600


def test_lowered_source_path_uses_the_private_cache(cache):
    fn = partir.jit(lambda x: x * 2, mesh=partir.Mesh({"batch": 4}),
                    tactics=[partir.BatchParallel("batch")])
    lowered = fn.lower(np.ones((8, 2), np.float32))
    path = lowered.source_path
    assert path.parent == cache and path.read_text() == lowered.source and _mode(path) == 0o600
