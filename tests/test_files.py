"""`files.writing`: a failed write is an OSError naming the file, decided by what the file system says (its errno, or
no space left on it), never by a library's wording; other errors keep their traceback."""

import errno
import os

import pytest
from safetensors import SafetensorError

from vaswani_mt.files import describe_os_error, no_space_left, writing

# what torch.save raises when a write fails: no errno, no file name, no word about space
TORCH_WRITE_FAILURE = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"


def statvfs_with(available_blocks: int):
    """os.statvfs of a file system with `available_blocks` blocks left for an unprivileged write."""
    return lambda path: os.statvfs_result((4096, 4096, 1000, available_blocks, available_blocks, 100, 50, 50, 0, 255))


@pytest.fixture
def full_disk(monkeypatch):
    monkeypatch.setattr(os, "statvfs", statvfs_with(0))


@pytest.mark.parametrize("error", [RuntimeError(TORCH_WRITE_FAILURE), SafetensorError("Error while serializing")])
def test_a_library_error_on_a_full_disk_is_one_line_naming_the_file(tmp_path, full_disk, error):
    target = tmp_path / "checkpoint-2"
    with pytest.raises(OSError) as raised:
        with writing(target):
            raise error
    assert raised.value.errno == errno.ENOSPC and raised.value.__cause__ is error
    assert describe_os_error(raised.value) == f"no space left on device: {target}"


def test_a_runtime_error_with_space_left_goes_on_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", statvfs_with(1000))
    error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError) as raised:
        with writing(tmp_path / "model"):
            raise error
    assert raised.value is error


def test_a_library_error_where_our_own_write_fails_too_is_one_line_with_that_errno(tmp_path, monkeypatch):
    """A disk quota or a failing disk: statvfs shows room, but a write beside the file fails, and says why."""
    monkeypatch.setattr(os, "statvfs", statvfs_with(1000))

    def over_quota(descriptor, data):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "write", over_quota)
    with pytest.raises(OSError) as raised:
        with writing(tmp_path / "checkpoint-2"):
            raise RuntimeError(TORCH_WRITE_FAILURE)
    assert raised.value.errno == errno.EDQUOT
    assert describe_os_error(raised.value) == f"{os.strerror(errno.EDQUOT)}: {tmp_path / 'checkpoint-2'}"
    assert list(tmp_path.iterdir()) == []  # the probe is gone


def test_a_safetensors_error_with_space_left_is_an_io_error_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", statvfs_with(1000))  # safetensors removed its temporary file: room again
    with pytest.raises(OSError) as raised:
        with writing(tmp_path / "model"):
            raise SafetensorError("Error while serializing: I/O error\nmore")
    assert raised.value.errno == errno.EIO
    assert describe_os_error(raised.value) == f"Error while serializing: I/O error: {tmp_path / 'model'}"


def test_an_os_error_keeps_its_errno_and_gets_the_file_name(tmp_path):
    with pytest.raises(OSError) as raised:
        with writing(tmp_path / "out.txt"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert describe_os_error(raised.value) == f"no space left on device: {tmp_path / 'out.txt'}"


def test_other_errors_and_a_broken_pipe_pass_through(tmp_path, full_disk):
    for error in (ValueError("a bug"), BrokenPipeError(errno.EPIPE, "Broken pipe")):
        with pytest.raises(type(error)) as raised:
            with writing(tmp_path / "out.txt"):
                raise error
        assert raised.value is error


def test_the_free_space_is_read_where_the_file_would_be_written(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(os, "statvfs", lambda path: asked.append(path) or statvfs_with(0)(path))
    assert no_space_left(tmp_path / "run" / "checkpoints" / "checkpoint-2")
    assert asked == [tmp_path]  # the nearest folder that exists
