"""Dropping a memory-mapped tensor's pages from the process once it has been read.

The quantizer and the GGUF writer read tensors through read-only file mappings (safetensors
shards, GGUF files). Every page they touch stays in the process's resident set until the mapping
is closed, so without help the resident set would grow by the whole checkpoint over a run, even
though only one block's weights (or one tensor) are in use at a time. After a tensor has been
used (converted to float32, or written out), `release(view)`
tells the kernel (madvise MADV_DONTNEED) that the pages under the view are not needed: for a
read-only file mapping they leave the resident set (the data stays in the page cache and is read
back on the next access, so this is always safe). Pages at the two ends may be shared with the
neighbouring tensors; those are simply faulted in again if used. No-op where madvise is not
available (not Linux) or the array is not a mapping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

import numpy as np

MADV_DONTNEED = 4
_libc = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    except OSError:
        _libc = None


def _is_mapped(a: np.ndarray) -> bool:
    base = a
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        base = getattr(base, "base", None)
    return False


def release(view) -> None:
    """Drops the resident pages under the read-only mapped array `view` (see the file header)."""
    if _libc is None or not isinstance(view, np.ndarray) or view.nbytes == 0:
        return
    if not _is_mapped(view) or view.flags.writeable:
        return
    page = mmap.PAGESIZE
    start = view.ctypes.data
    lo = start - start % page
    hi = start + view.nbytes
    hi += -hi % page
    _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_DONTNEED)
