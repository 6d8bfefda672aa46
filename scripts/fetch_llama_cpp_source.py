#!/usr/bin/env python3
"""Fetch upstream llama.cpp's Python converter from the llama-cpp-python 0.3.36 sdist on PyPI.

    python scripts/fetch_llama_cpp_source.py [--cache DIR] [--sdist FILE] [--quiet]

The sdist vendors the llama.cpp revision that llama-cpp-python 0.3.36 builds, whose
convert_hf_to_gguf.py (with its own gguf-py, which knows the qwen35 architecture) is the reference
the qwen35 converter tests compare against. Steps: read the release's file list from the PyPI JSON
API, download the .tar.gz (or take --sdist FILE, a local copy), check its SHA-256 against the one
PyPI publishes, and unpack the parts a conversion needs (convert_hf_to_gguf.py, conversion/,
gguf-py/, src/, models/templates/, LICENSE) into a temporary directory that is renamed into place
when complete. Prints the path of vendor/llama.cpp (run it as
`PYTHONPATH=<that>/gguf-py python <that>/convert_hf_to_gguf.py ...`).

The tree lands in DIR/llama-cpp-python-0.3.36 (default DIR: $BONSAI_CACHE or
~/.cache/bonsai-runner); when it exists nothing is downloaded. Exit status 1 with one line on
stderr when the network or the checksum fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
TREE = f"llama-cpp-python-{VERSION}"
SDIST_ROOT = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "src/", "models/templates/", "LICENSE")
JSON_URLS = (f"https://pypi.org/pypi/{PACKAGE}/{VERSION}/json", f"https://pypi.org/pypi/{PACKAGE}/json")
TIMEOUT_S = 60


class FetchError(Exception):
    pass


def default_cache_dir() -> Path:
    env = os.environ.get("BONSAI_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bonsai-runner"


def sdist_entry() -> tuple[str, str, int]:
    """(url, sha256, size) of the release's sdist, from the PyPI JSON API."""
    errors = []
    for url in JSON_URLS:   # the per-version endpoint first; some mirrors serve only the project one
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
                data = json.load(r)
        except (urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"{url}: {e}")
            continue
        files = data.get("urls") if url.endswith(f"/{VERSION}/json") else \
            (data.get("releases") or {}).get(VERSION)
        for f in files or []:
            if f.get("packagetype") == "sdist" and f.get("filename", "").endswith(".tar.gz"):
                return (urllib.parse.urljoin(url, f["url"]), f["digests"]["sha256"],
                        int(f.get("size") or 0))
        errors.append(f"{url}: no .tar.gz sdist listed for {VERSION}")
    raise FetchError("cannot find the sdist on PyPI (" + "; ".join(errors) + ")")


def download(url: str, dest: Path, say) -> None:
    say(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r, open(dest, "wb") as out:
            shutil.copyfileobj(r, out, 1 << 20)
    except (urllib.error.URLError, OSError) as e:
        raise FetchError(f"download of {url} failed: {e}") from None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpack(archive: Path, dest: Path) -> None:
    """Extracts the KEEP parts of vendor/llama.cpp into dest/vendor/llama.cpp."""
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(SDIST_ROOT):
                continue
            rel = m.name[len(SDIST_ROOT):]
            if not rel.startswith(KEEP) or ".." in Path(rel).parts or not (m.isfile() or m.isdir()):
                continue
            m.name = "vendor/llama.cpp/" + rel
            members.append(m)
        if not any(m.name.endswith("/convert_hf_to_gguf.py") for m in members):
            raise FetchError(f"{archive.name}: no {SDIST_ROOT}convert_hf_to_gguf.py inside")
        tar.extractall(dest, members=members, filter="data")


def fetch(cache: Path, sdist: Path | None = None, progress: bool = True) -> Path:
    """Path of vendor/llama.cpp in the cache, fetching and unpacking it first if needed."""
    def say(msg: str) -> None:
        if progress:
            print(f"[fetch_llama_cpp_source] {msg}", file=sys.stderr, flush=True)

    final = cache / TREE
    vendor = final / "vendor" / "llama.cpp"
    if (vendor / "convert_hf_to_gguf.py").is_file():
        return vendor
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{TREE}.", dir=cache))
    try:
        url, sha, _ = sdist_entry()
        archive = sdist if sdist is not None else work / url.rsplit("/", 1)[-1]
        if sdist is None:
            download(url, archive, say)
        got = sha256_of(archive)
        if got != sha:
            raise FetchError(f"{archive.name}: SHA-256 {got} is not PyPI's {sha}; the download is "
                             "corrupt or not the 0.3.36 sdist")
        say(f"unpacking {archive.name}")
        tree = work / "tree"
        unpack(archive, tree)
        try:
            os.rename(tree, final)
        except OSError:
            if not (vendor / "convert_hf_to_gguf.py").is_file():   # not a concurrent winner
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"ready: {vendor}")
    return vendor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", metavar="DIR", help="cache directory (default: $BONSAI_CACHE "
                        "or ~/.cache/bonsai-runner)")
    parser.add_argument("--sdist", metavar="FILE", help="use this local copy of "
                        f"llama_cpp_python-{VERSION}.tar.gz (its SHA-256 is still checked)")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    args = parser.parse_args(argv)
    cache = Path(args.cache).expanduser() if args.cache else default_cache_dir()
    try:
        vendor = fetch(cache, Path(args.sdist) if args.sdist else None, not args.quiet)
    except (FetchError, OSError, tarfile.TarError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(vendor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
