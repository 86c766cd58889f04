"""Exports of the torch model for the onnx and openvino backends, cached beside the model.

sentence-transformers' own ``backend="onnx"/"openvino"`` loads through optimum-onnx and
optimum-intel, and neither installs beside sentence-transformers 6 (optimum-onnx pins
transformers < 4.58, optimum-intel < 5.6 and an older huggingface-hub). So each export is
made with the backend's own maintained tooling, the same tools optimum wraps: torch's ONNX
exporter and ONNX Runtime's transformer optimiser and static quantiser; OpenVINO's model
converter and NNCF. The files keep sentence-transformers' layout and names
(``onnx/model.onnx``, ``onnx/model_O2.onnx``, ``openvino/openvino_model.xml``, ...), so an
export made with its tools, or shipped with the model, is used as it is.

Each export we make has a manifest beside it (``<file>.rerankq.json``,
``worker.engine.export_manifest``): the source weights' fingerprint, the tool versions and the
options, and each file's size and sha256. A start whose manifest matches, and whose files are
the ones recorded, reuses them; any difference exports again (a damaged file is said at
WARNING). One process exports at a time (a file lock), writing to a temporary name first, so
prefork children starting together export once.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from worker.engine.backend import BackendUnavailable
from worker.engine.export_manifest import Manifest, manifest_path
from worker.engine.int8_recipes import NONE, recipe
from worker.engine.quantize import Feed, onnx_quantized, openvino_quantized

log = structlog.get_logger("rerankq.export")


#: The files an export is made of, by backend and variant, in sentence-transformers' names.
ONNX_FILES = {
    "plain": "model.onnx",
    "O2": "model_O2.onnx",
    "O3": "model_O3.onnx",
    # One file per int8 recipe (``worker.engine.int8_recipes``); sentence-transformers' name for the first.
    "int8": "model_qint8_static.onnx",
    "int8-ffn": "model_qint8_static_ffn.onnx",
    "int8-dynamic": "model_qint8_dynamic.onnx",
}
OPENVINO_FILES = {
    "plain": "openvino_model.xml",
    "int8": "openvino_model_qint8_quantized.xml",
    "int8-ffn": "openvino_model_qint8_quantized_ffn.xml",
    "int8-weights": "openvino_model_qint8_weights.xml",
}
_WEIGHT_FILES = re.compile(r".*\.(safetensors|bin|pt|pth)$")


@dataclass(frozen=True)
class Artifact:
    path: Path
    #: A digest of its manifest (or, for a file we did not make, of its size and mtime).
    digest: str
    #: Whether this call made it (False: reused from an earlier start).
    exported: bool


def export_root(model_name: str) -> Path:
    """Beside the model when it is a writable local directory, else under the user's cache.

    A model installed as a package (the packaged bi-encoder, under site-packages) is not
    written beside: files there outlive an uninstall and may be shared by environments."""
    local = Path(model_name)
    installed = {"site-packages", "dist-packages"} & set(local.resolve().parts)
    if local.is_dir() and os.access(local, os.W_OK) and not installed:
        return local
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "--", model_name).strip("-") or "model"
    return Path.home() / ".cache" / "rerankq" / "exports" / safe


def source_fingerprint(model_name: str, network: Any) -> dict[str, Any]:
    """What the export was made from: the weight files' names, sizes and times and the
    config for a local directory; the hub revision for a model from the hub cache."""
    local = Path(model_name)
    config = network.config.to_json_string(use_diff=False)
    if local.is_dir():
        weights = sorted(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in local.iterdir()
            if p.is_file() and _WEIGHT_FILES.match(p.name)
        )
        return {"model": str(local.resolve()), "weights": weights, "config": _digest(config)}
    return {"model": model_name, "revision": getattr(network.config, "_commit_hash", None), "config": _digest(config)}


def _digest(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def package_versions(*modules: str) -> dict[str, str]:
    """Each package's installed version, or "absent"."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in modules:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "absent"
    return found


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".rerankq-export.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached(path: Path, manifest: dict[str, Any], make: Callable[[Path], Sequence[Path]]) -> Artifact:
    """The file at ``path``, made by ``make(tmp_dir)`` unless one made from ``manifest`` is there, whole.

    A file with no manifest of ours was put there by someone else (the model's authors,
    sentence-transformers' export functions) and is used as it is; the parity probe at load
    still judges it. One of ours is reused only while every file it was made of has the digest
    recorded when it was made (``export_manifest``); a damaged one is made again, said once at
    WARNING. ``make`` writes its files into a temporary directory under their final names; they
    are hashed there and moved into place together, the manifest last.
    """
    manifest = json.loads(json.dumps(manifest, sort_keys=True))  # as it reads back: tuples become lists
    digest = _digest(manifest)
    with _locked(path.parent):
        kept = None
        if path.exists():
            if not manifest_path(path).exists():
                stat = path.stat()
                return Artifact(path, _digest(["foreign", path.name, stat.st_size, stat.st_mtime_ns]), exported=False)
            kept = Manifest.read(path)
        if not path.exists():
            reason = "none made yet"
        elif kept is None:
            reason = "its manifest is unreadable or records no digests (made by an older rerankq)"
        elif kept.made_from != manifest:
            reason = "made from other weights, tool versions or options"
        else:
            damage = kept.damage(path)
            if damage is None:
                return Artifact(path, digest, exported=False)
            log.warning("export_damaged", path=str(path), reason=damage, action="exported again")
            reason = damage
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".export-") as tmp:
            made = make(Path(tmp))
            made_now = Manifest.of_files(manifest, made)
            for file in made:
                os.replace(file, path.parent / file.name)
            made_now.write(path)
        log.info("model_exported", path=str(path), reason=reason)
        return Artifact(path, digest, exported=True)


# --- the network as it is exported ------------------------------------------------------------


def export_copy(network: Any, *, eager_attention: bool) -> Any:
    """An fp32 CPU copy of the network to export, leaving the one that serves untouched.

    ONNX Runtime's transformer optimiser fuses attention only as the eager implementation
    writes it (scaled_dot_product_attention exports as separate ops it does not match); the
    two compute the same numbers.
    """
    import torch

    clone = copy.deepcopy(network).to("cpu", dtype=torch.float32).eval()
    if eager_attention and hasattr(clone, "set_attn_implementation"):
        clone.set_attn_implementation("eager")
    return clone


def example_inputs(tokenizer: Any, network: Any) -> dict[str, Any]:
    """Two pairs of different lengths, in the order the network's forward takes them.

    The trace must see padding, or a masking step that skips an all-ones mask would be
    frozen into the graph. The order matters: the TorchScript exporter names the graph's
    inputs positionally, so names in the tokenizer's order (token_type_ids before
    attention_mask) would swap the two.
    """
    import inspect

    encoded = tokenizer(
        ["an example query", "an example query"],
        ["a short document", "a somewhat longer document with more words in it"],
        padding=True,
        return_tensors="pt",
    )
    order = list(inspect.signature(network.forward).parameters)
    names = sorted((k for k in encoded if k in ("input_ids", "attention_mask", "token_type_ids")), key=order.index)
    return {k: encoded[k] for k in names}


# --- ONNX --------------------------------------------------------------------------------------


def token_states(encoder: Any) -> Any:
    """The encoder as a module of the token inputs alone, giving its last hidden states: what
    the TorchScript exporter traces (an encoder's own forward takes cache arguments it fills
    in twice)."""
    import torch

    class TokenStates(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            kwargs = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state

    return TokenStates().eval()


def onnx_export(network: Any, tokenizer: Any, directory: Path) -> list[Path]:
    """torch's TorchScript-based ONNX exporter: the graph ONNX Runtime's fusions recognise."""
    import warnings

    import torch

    clone = export_copy(network, eager_attention=True)
    # A classifier gives one logit row per pair; a bare encoder (a bi-encoder's transformer)
    # gives a state per token, its sequence axis as dynamic as the inputs'.
    if clone.base_model is clone:
        clone = token_states(clone)
        outputs = {"last_hidden_state": {0: "batch", 1: "sequence"}}
    else:
        outputs = {"logits": {0: "batch"}}
    inputs = example_inputs(tokenizer, clone)
    names = list(inputs)
    target = directory / ONNX_FILES["plain"]
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        torch.onnx.export(
            clone,
            (),
            str(target),
            kwargs=inputs,
            input_names=names,
            output_names=list(outputs),
            dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in names}, **outputs},
            opset_version=17,
            dynamo=False,
        )
    return [target]


def onnx_optimize(source: Path, directory: Path, *, level: str, config: Any) -> list[Path]:
    """ONNX Runtime's transformer optimiser, the one optimum's O2/O3 run: attention,
    embedding, skip-layer-norm and bias-GELU fusions (O3 also approximates GELU)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.enable_gelu_approximation = level == "O3"
    optimized = optimize_model(
        str(source),
        model_type="bert",
        num_heads=int(config.num_attention_heads),
        hidden_size=int(config.hidden_size),
        optimization_options=options,
        opt_level=0,
    )
    target = directory / ONNX_FILES[level]
    optimized.save_model_to_file(str(target))
    return [target]


def onnx_artifact(
    model_name: str,
    network: Any,
    tokenizer: Any,
    *,
    level: str,
    quantization: str,
    calibration: Callable[[], Sequence[Feed]],
    calibration_digest: str | None,
) -> Artifact:
    directory = export_root(model_name) / "onnx"
    base = {
        "source": source_fingerprint(model_name, network),
        "tools": package_versions("torch", "onnx", "onnxruntime"),
    }
    plain = cached(
        directory / ONNX_FILES["plain"], {**base, "variant": "plain"}, lambda tmp: onnx_export(network, tokenizer, tmp)
    )
    if quantization != NONE:
        return _quantized("onnx", ONNX_FILES, directory, base, plain, quantization, calibration, calibration_digest)
    if level == "O1":
        return plain
    manifest = {**base, "variant": level, "from": plain.digest}
    return cached(
        directory / ONNX_FILES[level],
        manifest,
        lambda tmp: onnx_optimize(plain.path, tmp, level=level, config=network.config),
    )


# --- OpenVINO ----------------------------------------------------------------------------------


def openvino_export(network: Any, tokenizer: Any, directory: Path) -> list[Path]:
    """OpenVINO's PyTorch converter (what optimum-intel runs), weights kept in fp32."""
    import warnings

    import openvino as ov
    import torch

    target = directory / OPENVINO_FILES["plain"]
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer notes
        clone = export_copy(network, eager_attention=False)
        model = ov.convert_model(clone, example_input=example_inputs(tokenizer, clone))
    ov.save_model(model, str(target), compress_to_fp16=False)
    return [target.with_suffix(".bin"), target]


def openvino_artifact(
    model_name: str,
    network: Any,
    tokenizer: Any,
    *,
    quantization: str,
    calibration: Callable[[], Sequence[Feed]],
    calibration_digest: str | None,
) -> Artifact:
    directory = export_root(model_name) / "openvino"
    base = {"source": source_fingerprint(model_name, network), "tools": package_versions("torch", "openvino", "nncf")}
    plain = cached(
        directory / OPENVINO_FILES["plain"],
        {**base, "variant": "plain"},
        lambda tmp: openvino_export(network, tokenizer, tmp),
    )
    if quantization == NONE:
        return plain
    return _quantized("openvino", OPENVINO_FILES, directory, base, plain, quantization, calibration, calibration_digest)


def _quantized(
    backend: str,
    files: dict[str, str],
    directory: Path,
    base: dict[str, Any],
    plain: Artifact,
    quantization: str,
    calibration: Callable[[], Sequence[Feed]],
    calibration_digest: str | None,
) -> Artifact:
    """The recipe's int8 export of ``plain``, under the recipe's file name in ``directory``; a
    calibrated recipe's manifest names the windows it was calibrated on (one that reads none, none)."""
    how = recipe(quantization)
    if backend not in how.backends:
        raise BackendUnavailable(f"the int8 recipe {quantization} is made for {', '.join(how.backends)}, not {backend}")
    calibrated = how.calibrated
    path = directory / files[quantization]
    manifest = {
        **base,
        "variant": quantization,
        "from": plain.digest,
        "calibration": calibration_digest if calibrated else None,
    }
    quantize = onnx_quantized if backend == "onnx" else openvino_quantized

    def make(tmp: Path) -> list[Path]:
        return quantize(plain.path, tmp / path.name, quantization, calibration() if calibrated else [])

    return cached(path, manifest, make)
