"""The packaged models: parts found in installed packages, assembled in order, checked by sha256."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from voice_context.testing.models import MODELS, ModelError, PackagedModel, assemble, locate

PARTS = [b"GGUF head ", b"middle of the weights ", b"tail"]


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Three installed packages ``vcpart1..3``, each holding ``data/partNN.bin``."""
    site = tmp_path / "site"
    for i, data in enumerate(PARTS, start=1):
        (site / f"vcpart{i}" / "data").mkdir(parents=True)
        (site / f"vcpart{i}" / "__init__.py").write_text("raise ImportError('never imported')\n")
        (site / f"vcpart{i}" / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("VOICE_CONTEXT_MODELS", str(tmp_path / "models"))
    yield site
    for i in range(1, len(PARTS) + 1):
        sys.modules.pop(f"vcpart{i}", None)


def split_model(sha256: str, count: int = len(PARTS)) -> PackagedModel:
    return PackagedModel(
        name="tiny",
        title="a tiny split model",
        alias="tiny",
        file="tiny.gguf",
        requirements=(),
        parts=tuple((f"vcpart{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1)),
        sha256=sha256,
    )


def test_a_split_model_is_its_parts_in_order_and_is_assembled_once(packages: Path, tmp_path: Path) -> None:
    whole = b"".join(PARTS)
    model = split_model(hashlib.sha256(whole).hexdigest())
    assert locate(model) is None
    path = assemble(model)
    assert path == tmp_path / "models" / "tiny.gguf"
    assert path.read_bytes() == whole
    assert locate(model) == path
    stamp = path.stat().st_mtime_ns
    assert assemble(model) == path and path.stat().st_mtime_ns == stamp


def test_parts_that_do_not_make_the_pinned_file_leave_nothing_behind(packages: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="assemble to sha256"):
        assemble(split_model("0" * 64))
    assert list((tmp_path / "models").iterdir()) == []


def test_a_missing_package_says_how_to_install_it(packages: Path) -> None:
    model = split_model("0" * 64, count=4)
    with pytest.raises(ModelError, match="vcpart4 is not installed; run scripts/models tiny"):
        assemble(model)
    assert locate(model) is None


def test_the_catalogue_pins_every_part_and_a_sha256() -> None:
    assert set(MODELS) == {"smollm2", "qwen-1.5b", "qwen-0.5b"}
    assert [len(m.parts) for m in MODELS.values()] == [1, 22, 6]
    for model in MODELS.values():
        assert len(model.requirements) == len(model.parts)
        assert all("==" in requirement for requirement in model.requirements)
        assert len(model.sha256) == 64
