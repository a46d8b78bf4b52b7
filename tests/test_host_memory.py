"""Training on CPU keeps freed memory in the process (glibc malloc), and goes on without where it cannot."""

import ctypes
import platform

import pytest

from vaswani_mt.recipe import host_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_settings_that_keep_freed_memory():
    assert host_memory.keep_freed_memory() is True


def test_a_c_library_without_mallopt_leaves_malloc_as_it_is(monkeypatch):
    class NoMallopt:
        def __init__(self, name):
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert host_memory.keep_freed_memory() is False


def test_a_c_library_that_refuses_a_setting_is_reported(monkeypatch):
    class Refusing:
        def __init__(self, name):
            self.mallopt = lambda parameter, value: 0

    monkeypatch.setattr(ctypes, "CDLL", Refusing)
    assert host_memory.keep_freed_memory() is False
