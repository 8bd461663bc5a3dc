"""Finding an Ouro checkpoint: a local folder or a Hugging Face Hub id (the cache first, never remote code),
its identity (config and the sha256 of its weights and tokenizer files), and loading it through the native
class (engine.ouro.modeling), registered with the transformers Auto classes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import torch

from engine.errors import UsageError

WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model",
)  # fmt: skip
IDENTITY_FILES = ("config.json", *WEIGHT_FILES, *TOKENIZER_FILES)  # what the results depend on
DOWNLOAD_PATTERNS = [*IDENTITY_FILES, "generation_config.json"]  # never the remote modeling code
HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class ModelSource:
    spec: str  # what the user passed
    path: Path  # a local folder with config.json, safetensors and tokenizer files
    hub_id: str | None = None
    revision: str | None = None  # the Hub commit of a cached snapshot, when known
    slug: str = ""
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256 (see file_digest)


def not_cached_message(spec: str) -> str:
    return (
        f"the model {spec} is not in the local Hugging Face cache and the Hub cannot be reached from here; "
        f"fetch it on a machine with internet with 'hf download {spec} --local-dir FOLDER' (huggingface_hub's CLI), "
        "copy FOLDER here and pass it with --model FOLDER."
    )


def hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "")
    return constants.HF_HUB_OFFLINE or flag.upper() in {"1", "ON", "YES", "TRUE"}


def hub_reachable(timeout: float = 5.0) -> bool:
    """False when offline mode is set or the Hub's host does not accept a TCP connection within `timeout`."""
    if hub_offline():
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy decides; snapshot_download's own timeouts apply
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def looks_like_path(spec: str) -> bool:
    if spec.startswith(("/", "./", "../", "~", ".\\")) or spec.endswith(("/", os.sep)) or spec.count("/") > 1:
        return True
    head = spec.split("/")[0]
    return "/" in spec and Path(head).is_dir()  # e.g. cached_results/e1-demo


def slug_of(spec: str, path: Path) -> str:
    """A short file-name part: 'ByteDance/Ouro-1.4B' -> 'ouro-1.4b', 'cached_results/e1-demo' -> 'demo'."""
    name = None
    for part in (path, *path.parents):  # a Hub cache snapshot: .../models--ByteDance--Ouro-1.4B/snapshots/<sha>
        if part.name.startswith("models--"):
            name = part.name.split("--")[-1]
            break
    name = name or (spec.rstrip("/").split("/")[-1] if not Path(spec).exists() else path.name)
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"
    return slug.removeprefix("e1-") or slug  # the table is e1-<slug>: no "e1-e1-"


def checkpoint_problem(path: Path) -> str | None:
    """None if `path` holds config.json and every safetensors shard it needs; else what is missing."""
    if not (path / "config.json").is_file():
        return "has no config.json"
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError):
            return "has an unreadable model.safetensors.index.json"
        missing = sorted(s for s in shards if not (path / s).is_file())
        return f"lacks the weight shards {', '.join(missing)}" if missing else None
    if not any(path.glob("*.safetensors")):
        return "has no *.safetensors weights (pickle checkpoints are not loaded)"
    return None


def resolve_model(spec: str) -> ModelSource:
    """A local folder as given, else a Hub id from the local cache, else downloaded (when the Hub is reachable)."""
    local = Path(spec).expanduser()
    if local.exists() or looks_like_path(spec):
        if not local.is_dir():
            raise UsageError(
                f"--model {spec} is not a folder; pass a checkpoint folder (config.json, *.safetensors, "
                "tokenizer files) or a Hugging Face id such as ByteDance/Ouro-1.4B."
            )
        if problem := checkpoint_problem(local):
            raise UsageError(f"--model {spec} {problem}; pass a folder written by save_pretrained or the Hub.")
        return _source(spec, local.resolve(), None)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        path = Path(snapshot_download(spec, allow_patterns=DOWNLOAD_PATTERNS, local_files_only=True))
        if checkpoint_problem(path):
            path = None  # a partial snapshot: complete it online if we can
    except HFValidationError:
        raise UsageError(
            f"--model {spec} is neither a local folder nor a valid Hugging Face id (like ByteDance/Ouro-1.4B)."
        ) from None
    except (OSError, ValueError):  # LocalEntryNotFoundError is an OSError
        path = None
    if path is None:
        if not hub_reachable():
            raise UsageError(not_cached_message(spec))
        path = _download(spec)
    if problem := checkpoint_problem(path):
        raise UsageError(f"the Hub snapshot of {spec} {problem}; it is not an Ouro checkpoint this tool can load.")
    return _source(spec, path, spec)


def _download(spec: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    print(f"loopscope: downloading {spec} (safetensors, config, tokenizer) into the Hugging Face cache ...")
    try:
        return Path(snapshot_download(spec, allow_patterns=DOWNLOAD_PATTERNS, etag_timeout=10))
    except GatedRepoError:
        raise UsageError(f"{spec} is gated on the Hub; accept its terms and log in ('hf auth login').") from None
    except RepositoryNotFoundError:
        raise UsageError(f"there is no model {spec} on the Hugging Face Hub; check the id.") from None
    except (HfHubHTTPError, OSError):
        raise UsageError(not_cached_message(spec)) from None


def _source(spec: str, path: Path, hub_id: str | None) -> ModelSource:
    revision = path.name if path.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", path.name) else None
    files = {f.name: file_digest(f) for pattern in IDENTITY_FILES for f in sorted(path.glob(pattern)) if f.is_file()}
    return ModelSource(spec, path, hub_id, revision, slug_of(spec, path), files)


def file_digest(path: Path) -> str:
    """sha256 of the file; for a Hub-cache large file the blob's name already is its sha256 (git LFS)."""
    target = path.resolve()
    if path.is_symlink() and HEX64.match(target.name) and target.stat().st_size > (1 << 20):
        return target.name
    h = hashlib.sha256()
    with open(target, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def model_key(source: ModelSource) -> str:
    config = json.loads((source.path / "config.json").read_text())
    blob = json.dumps({"config": config, "files": source.files}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_model(source: ModelSource, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import engine.ouro.modeling  # noqa: F401  (registers model_type "ouro" with the Auto classes)

    try:
        config = AutoConfig.from_pretrained(source.path)
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"cannot read {source.path / 'config.json'} ({_first_line(e)}).") from None
    if config.model_type != "ouro":
        raise UsageError(
            f"--model {source.spec} is a {config.model_type!r} checkpoint; E1 probes Ouro checkpoints "
            "(model_type 'ouro'), such as ByteDance/Ouro-1.4B."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path)
        model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot load the checkpoint in {source.path} ({_first_line(e)}).") from None
    return model.to(device).eval(), tokenizer


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


# ---------------------------------------------------------------- what a probe will cost, before anything loads

RELEASED_PARAMS = {"ByteDance/Ouro-1.4B": 1_434_652_673, "ByteDance/Ouro-2.6B": 2_667_974_657}  # docs/design.md §1
# seconds per prompt for one n = 8 forward of a 1.4B model on this project's 2-core CPU, batch 16
# (docs/performance.md, "Performance (2 CPU cores)": fp32 4.10 s at batch 4, bf16 0.95 s); other sizes and n scale
# linearly
SECONDS_PER_PROMPT_1B4_N8 = {"float32": 4.10, "bfloat16": 0.95}


def config_params(config: dict) -> int:
    """Parameters of an Ouro checkpoint from its config: embeddings, untied head, the layers (four RMSNorms,
    attention, SwiGLU MLP, no biases), the final norm and the exit gate (with its bias)."""
    d, f, v, layers = (config[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers"))
    return 2 * v * d + layers * (4 * d * d + 3 * d * f + 4 * d) + d + (d + 1)


def locate(spec: str) -> tuple[Path | None, bool]:
    """Where the checkpoint is without downloading anything: (folder or None, whether it is a Hub id)."""
    local = Path(spec).expanduser()
    if local.exists() or looks_like_path(spec):
        return (local if local.is_dir() else None), False
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, allow_patterns=DOWNLOAD_PATTERNS, local_files_only=True)), True
    except Exception:  # not cached (or not a valid id: the real run says which)
        return None, True


def plan(spec: str, dtype: str, prompts: int, tasks: list[str], n_max: int) -> dict:
    """What `loopscope ouro` will read or download, the memory the weights take, and the time it should take
    on this project's CPU (modes x tasks x prompts forwards of n_max loops)."""
    path, is_hub = locate(spec)
    params = None
    if path is not None and (path / "config.json").is_file():
        params = config_params(json.loads((path / "config.json").read_text()))
    params = params or RELEASED_PARAMS.get(spec)
    bytes_per = {"float32": 4, "bfloat16": 2}[dtype]
    forwards = 2 * len(tasks) * prompts
    seconds = None
    if params:
        seconds = forwards * SECONDS_PER_PROMPT_1B4_N8[dtype] * params / RELEASED_PARAMS["ByteDance/Ouro-1.4B"]
        seconds *= n_max / 8
    return {
        "model": spec,
        "source": str(path) if path else f"download from the Hugging Face Hub ({', '.join(DOWNLOAD_PATTERNS)})",
        "cached": path is not None,
        "hub": is_hub,
        "parameters": params,
        "weights_gib": params * bytes_per / 2**30 if params else None,
        "forwards": forwards,
        "estimated_s": seconds,
    }
