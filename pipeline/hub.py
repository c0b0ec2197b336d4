"""`ortllm pull hf.co/ORG/REPO[:QUANT|:FILE]`: a model on a Hugging Face hub -> local files the build reads.

    spec --parse_spec--> HubSpec --resolve--> HubPlan: the files to fetch, each with the hub's sha256 (LFS oid) or
                                             git oid; the architecture checked BEFORE any weight is fetched
                                             (config.json, or a GGUF header's first KiB by a Range request)
         --download--> huggingface_hub's cache (resumable, its tqdm bars) --sha256 check--> a path to build

Spec forms (SEL: a quant tag, Q4_K_M matching *q4_k_m*.gguf case-insensitively, or a file name):
    hf.co/ORG/REPO[:SEL]   huggingface.co/ORG/REPO[:SEL]   hf://ORG/REPO[:SEL]
    https://HOST/ORG/REPO/resolve/REV/FILE (or /blob/): that file of that repository, on that hub
    https://HOST/PATH/NAME.gguf: a plain GGUF download into $ORTLLM_HOME/downloads/ (resumable; checked against the
                                 server's sha256 ETag when it publishes one)
Without SEL: the safetensors weights when the repository has them (config.json + *.safetensors), else its GGUF
by GGUF_ORDER (Q4_K_M first, as Ollama picks).

huggingface_hub reads HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE and HF_HOME / HF_HUB_CACHE. Offline, the files come
from its cache: refs/REV names the commit, and each blob's file name is its etag (the sha256 of an LFS file, the
git oid of another), which the check then uses.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlparse

from ortllm.runtime.artifact import sha256_file

from .errors import BuildError
from .families import GGUF_ARCHS, hf_config
from .gguf_header import gguf_architecture


class HubError(BuildError):
    """A hub pull cannot go on; the message says what to do."""


# the default GGUF when no quant is named: Ollama's Q4_K_M, then the other 4-bit types, then wider, then narrower
GGUF_ORDER = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "IQ4_XS", "IQ4_NL", "Q5_K_M", "Q5_K_S", "Q5_0", "Q5_1", "Q6_K",
              "Q8_0", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "BF16", "F16", "F32")
# beside config.json and the weights, what the build's tokenizer and chat template read (when the repo has them)
HF_EXTRAS = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
             "special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "chat_template.json",
             "chat_template.jinja")
SHARDS_INDEX = "model.safetensors.index.json"
RETRIES = 4                       # attempts per file; each one after the first resumes with a Range request
_SPLIT = re.compile(r"-\d{5}-of-(\d{5})\.gguf$", re.I)
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_FILE_URL = re.compile(r"^(https?://[^/]+)/([^/]+/[^/]+)/(?:resolve|blob)/([^/]+)/(.+)$")
_PREFIXES = ("hf.co/", "huggingface.co/", "hf://")
_PUBLIC_HOSTS = ("hf.co", "huggingface.co")


@dataclass(frozen=True)
class HubSpec:
    text: str                       # as the user gave it (the store's source: `ortllm pull TEXT` rebuilds it)
    repo_id: str = ""               # ORG/REPO
    selector: str | None = None     # a quant tag or a file of the repository
    revision: str = "main"
    endpoint: str | None = None     # None: huggingface_hub's (HF_ENDPOINT, else huggingface.co)
    url: str | None = None          # a plain URL: no repository

    def key(self) -> tuple:
        """Equal for specs of the same file(s): hf.co/ = hf:// = huggingface.co/, tags and names in any case."""
        return (self.url, self.endpoint, self.repo_id.lower(), (self.selector or "").lower(), self.revision)


@dataclass(frozen=True)
class HubFile:
    path: str                       # in the repository
    size: int | None
    sha256: str | None = None       # LFS files: the hub's sha256 of the content
    git_oid: str | None = None      # other files: the git blob id (sha1 of "blob <size>\0" + content)


@dataclass
class HubPlan:
    spec: HubSpec
    kind: str                       # "gguf" | "hf"
    files: list[HubFile]            # to fetch, in order (the GGUF; or config.json, tokenizer files, the shards)
    name: str                       # the store name it gets unless --name is given
    downloads: Path                 # plain URLs: downloaded into downloads/<sha256 of the URL, 16 hex>/NAME
    progress: bool = True           # huggingface_hub's tqdm bars (else a log line per file)
    offline: bool = False
    cached: dict[str, Path] = field(default_factory=dict)   # offline: repository path -> cached file
    fetched: dict[str, Path] = field(default_factory=dict)  # files resolve already fetched (config.json)


def parse_spec(text: str) -> HubSpec | None:
    """A hub or URL spec, or None for anything else (a recipe, a local path)."""
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            repo, _, sel = text[len(prefix):].partition(":")
            repo = repo.strip("/")
            if not _REPO.match(repo):
                raise HubError(f"{text!r} names no repository: give {prefix}ORG/REPO[:QUANT or FILE], e.g. "
                               f"{prefix}Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M")
            return HubSpec(text, repo, sel if sel and sel != "latest" else None)
    if not text.startswith(("https://", "http://")):
        return None
    m = _HUB_FILE_URL.match(text.split("?")[0])
    if m:
        host, repo, rev, path = m.groups()
        endpoint = None if urlparse(host).hostname in _PUBLIC_HOSTS else host
        return HubSpec(text, repo, unquote(path), unquote(rev), endpoint)
    if urlparse(text).path.lower().endswith(".gguf"):
        return HubSpec(text, url=text)
    raise HubError(f"{text!r} is neither a GGUF file's URL nor a hub file's (https://HOST/ORG/REPO/resolve/REV/"
                   "FILE); to pull a whole repository give hf.co/ORG/REPO[:QUANT]")


def missing_path_hint(text: str) -> HubError | None:
    """For a path that does not exist but reads as ORG/REPO: the error that says how to pull it from the hub."""
    if _REPO.match(text) and not text.lower().endswith((".gguf", ".safetensors", ".json", ".bin")):
        return HubError(f"{text} is neither a local path nor a recipe; to download it from Hugging Face name it "
                        f"hf.co/{text} (a GGUF repository with a quant: hf.co/{text}:Q4_K_M), e.g. "
                        f"ortllm pull hf.co/{text}")
    return None


# ---------------------------------------------------------------- resolve: what to fetch, and may it be built

def resolve(spec: HubSpec, downloads: Path, progress: bool, log: Callable[[str], None]) -> HubPlan:
    """The files to fetch; config.json (or the GGUF header's bytes) read to refuse an unsupported architecture
    before any weight is downloaded."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    (enable_progress_bars if progress else disable_progress_bars)()
    if spec.url:
        return _resolve_url(spec, downloads, progress)
    files, offline, cached = _listing(spec, log)
    kind, chosen = _choose(spec, files)
    plan = HubPlan(spec, kind, chosen, _default_name(spec, kind, chosen), downloads, progress, offline, cached)
    where = f"{spec.text} ({'the Hugging Face cache' if offline else _endpoint(spec)})"
    if kind == "gguf":
        f = chosen[0]
        arch = gguf_architecture(lambda n: _head_bytes(plan, f, n), f"{spec.repo_id}/{f.path}")
        if arch is not None and arch not in GGUF_ARCHS:
            raise HubError(f"{where}: {f.path} is a GGUF of architecture '{arch}', which ortllm does not build "
                           f"(supported: {', '.join(sorted(GGUF_ARCHS))}); nothing of its weights was downloaded")
        return plan
    config = fetch(plan, chosen[0], log)
    try:
        hf_config(json.loads(config.read_text()))
    except BuildError as e:
        raise HubError(f"{where} cannot be built: {e}; its weights were not downloaded") from None
    except (KeyError, ValueError) as e:
        raise HubError(f"{where}: config.json is not a model config ({type(e).__name__}: {e})") from None
    plan.fetched[chosen[0].path] = config
    if SHARDS_INDEX in {f.path for f in chosen}:     # the shards the index names, instead of every *.safetensors
        index = next(f for f in chosen if f.path == SHARDS_INDEX)
        plan.fetched[SHARDS_INDEX] = fetch(plan, index, log)
        shards = sorted(set(json.loads(plan.fetched[SHARDS_INDEX].read_text()).get("weight_map", {}).values()))
        missing = [s for s in shards if s not in files]
        if missing or not shards:
            lacks = "the cache lacks (pull it once online)" if offline else "the repository lacks"
            raise HubError(f"{where}: {SHARDS_INDEX} names shards {lacks}: {', '.join(missing[:5])}"
                           if missing else f"{where}: {SHARDS_INDEX} names no shards")
        plan.files = [f for f in chosen if not f.path.endswith(".safetensors")] + [files[s] for s in shards]
    return plan


def _endpoint(spec: HubSpec) -> str:
    from huggingface_hub import constants
    return spec.endpoint or constants.ENDPOINT


def _offline() -> bool:
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


def _listing(spec: HubSpec, log) -> tuple[dict[str, HubFile], bool, dict[str, Path]]:
    """(repository path -> HubFile, offline, cached paths when offline): the hub's file list with each file's size
    and hashes, or, offline or with the hub out of reach, what the cache holds of the revision."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    from requests.exceptions import ConnectionError, Timeout

    if _offline():
        return _cached_listing(spec, "offline mode is on (HF_HUB_OFFLINE=1)")
    endpoint = _endpoint(spec)
    try:
        info = HfApi(endpoint=endpoint).model_info(spec.repo_id, revision=spec.revision, files_metadata=True)
    except HfHubHTTPError as e:
        raise _refused(e, spec, spec.repo_id) from None
    except (ConnectionError, Timeout, OfflineModeIsEnabled) as e:
        files, _, cached = _cached_listing(spec, f"cannot reach {endpoint} ({type(e).__name__})", missing_ok=True)
        if not files:
            raise HubError(f"cannot reach {endpoint} ({type(e).__name__}) and {spec.repo_id} is not in the Hugging "
                           "Face cache: check the network (or HF_ENDPOINT)") from None
        log(f"cannot reach {endpoint}: using the cached copy of {spec.repo_id}")
        return files, True, cached
    files = {}
    for s in info.siblings or []:
        lfs = s.lfs
        files[s.rfilename] = HubFile(s.rfilename, lfs.size if lfs else s.size, lfs.sha256 if lfs else None,
                                     None if lfs else s.blob_id)
    return files, False, {}


def _refused(e, spec: HubSpec, what: str) -> HubError:
    """A hub's HTTP error (huggingface_hub's HfHubHTTPError family) as what to do about it."""
    from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, RepositoryNotFoundError,
                                        RevisionNotFoundError)
    endpoint = _endpoint(spec)
    if isinstance(e, GatedRepoError):
        return HubError(f"{spec.repo_id} on {endpoint} is gated: accept its terms on its page, then set HF_TOKEN to "
                        "a token of that account")
    if isinstance(e, RepositoryNotFoundError):
        return HubError(f"no model repository {spec.repo_id} on {endpoint}: check the name (ORG/REPO, as on its "
                        "page); a private or gated one needs HF_TOKEN")
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"{spec.repo_id} on {endpoint} has no revision '{spec.revision}'")
    if isinstance(e, EntryNotFoundError):
        return HubError(f"{spec.repo_id} on {endpoint} lists {what} but does not serve it; try again later")
    status = e.response.status_code if e.response is not None else "an error"
    return HubError(f"{endpoint} answered {status} for {what}: {str(e).strip().splitlines()[0]}")


def _cached_listing(spec: HubSpec, why: str, missing_ok: bool = False):
    """The cached snapshot of spec.revision: its files, each checked later against its blob's name (the etag)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(constants.HF_HUB_CACHE)
    storage = cache / repo_folder_name(repo_id=spec.repo_id, repo_type="model")
    ref = storage / "refs" / spec.revision
    commit = ref.read_text().strip() if ref.is_file() else spec.revision
    snapshot = storage / "snapshots" / commit
    if not snapshot.is_dir():
        if missing_ok:
            return {}, True, {}
        raise HubError(f"{why} and {spec.repo_id} (revision {spec.revision}) is not in the Hugging Face cache "
                       f"({cache}): pull it once online, or unset HF_HUB_OFFLINE")
    files, cached = {}, {}
    for p in sorted(snapshot.rglob("*")):
        if p.is_file():
            rel = p.relative_to(snapshot).as_posix()
            etag = p.resolve().name
            files[rel] = HubFile(rel, p.stat().st_size, etag if len(etag) == 64 else None,
                                 etag if len(etag) == 40 else None)
            cached[rel] = p
    return files, True, cached


def _choose(spec: HubSpec, files: dict[str, HubFile]) -> tuple[str, list[HubFile]]:
    """("gguf", [the GGUF]) or ("hf", [config.json, tokenizer files, weights]) by the spec's selector."""
    ggufs = sorted(p for p in files if p.lower().endswith(".gguf") and "mmproj" not in p.lower())
    weights = sorted(p for p in files if p.endswith(".safetensors") and "/" not in p)
    listing = _names(ggufs) if ggufs else _names(sorted(files))
    sel = spec.selector
    if sel is not None and (sel in files or sel.lower().endswith(".gguf")):
        if sel not in files:
            raise HubError(f"{spec.repo_id} has no file '{sel}'; its GGUF files: {listing}")
        if not sel.lower().endswith(".gguf"):
            raise HubError(f"'{sel}' is not a GGUF file: name a *.gguf of {spec.repo_id} ({listing}), or give "
                           f"hf.co/{spec.repo_id} alone for its safetensors weights")
        return "gguf", [_single(spec, files[sel])]
    if sel is not None:
        hits = [p for p in ggufs if sel.lower() in Path(p).name.lower()]
        if not hits:
            raise HubError(f"no GGUF file of {spec.repo_id} matches the quant tag '{sel}'; its GGUF files: {listing}"
                           f" (pull one as hf.co/{spec.repo_id}:FILE, or with a tag its name contains)")
        return "gguf", [_single(spec, files[_best(hits, sel)])]
    if "config.json" in files and weights:
        extras = [files[p] for p in HF_EXTRAS if p in files]
        index = [files[SHARDS_INDEX]] if SHARDS_INDEX in files else []
        return "hf", [files["config.json"], *index, *extras, *(files[w] for w in weights)]
    whole = [p for p in ggufs if not _SPLIT.search(p)]
    if whole:
        for tag in GGUF_ORDER:
            hits = [p for p in whole if tag.lower() in Path(p).name.lower()]
            if hits:
                return "gguf", [files[_best(hits, tag)]]
        return "gguf", [files[whole[0]]]
    if ggufs:
        return "gguf", [_single(spec, files[ggufs[0]])]
    bins = [p for p in files if p.endswith((".bin", ".pt", ".pth"))]
    raise HubError(f"{spec.repo_id} has no weights ortllm reads (config.json with *.safetensors, or *.gguf)"
                   + (f"; it has {_names(bins)}: convert them to safetensors first" if bins else
                      f"; its files: {listing}"))


def _best(hits: list[str], tag: str) -> str:
    """Among files whose names contain the tag: the tag as a whole word first, then single files, then by
    GGUF_ORDER (`Q4_K` takes model-Q4_K_M.gguf over model-Q4_K_S.gguf), then the shortest name."""
    word = re.compile(rf"(^|[^a-z0-9]){re.escape(tag.lower())}([^a-z0-9_]|$)")

    def rank(p: str) -> int:
        name = Path(p).name.lower()
        return next((i for i, t in enumerate(GGUF_ORDER) if t.lower() in name), len(GGUF_ORDER))
    return min(hits, key=lambda p: (not word.search(Path(p).name.lower()), bool(_SPLIT.search(p)), rank(p), len(p), p))


def _single(spec: HubSpec, f: HubFile) -> HubFile:
    m = _SPLIT.search(f.path)
    if m:
        raise HubError(f"{spec.repo_id}/{f.path} is one of {int(m.group(1))} parts of a split GGUF, which ortllm "
                       "does not read yet: pick a quant that is one file, or merge the parts with llama.cpp's "
                       "llama-gguf-split --merge and pull the merged file's path")
    return f


def _names(paths: list[str], most: int = 20) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "") or "none"


def _default_name(spec: HubSpec, kind: str, chosen: list[HubFile]) -> str:
    """The GGUF file's stem (it names the quant), or the repository's name."""
    if kind == "gguf":
        return re.sub(r"\.gguf$", "", Path(chosen[0].path).name, flags=re.I)
    return spec.repo_id.split("/")[-1]


def _head_bytes(plan: HubPlan, f: HubFile, n: int) -> bytes:
    """The first n bytes of a repository file: from the cache, or by a Range request."""
    if f.path in plan.cached:
        with open(plan.cached[f.path], "rb") as fh:
            return fh.read(n)
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.errors import HfHubHTTPError
    url = hf_hub_url(plan.spec.repo_id, f.path, revision=plan.spec.revision, endpoint=plan.spec.endpoint)
    try:
        return _range(url, n, build_hf_headers())
    except HfHubHTTPError as e:
        raise _refused(e, plan.spec, f"{plan.spec.repo_id}/{f.path}") from None


def _range(url: str, n: int, headers: dict) -> bytes:
    """bytes 0..n-1 of url (a server that ignores Range is read no further than n bytes)."""
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import get_session, hf_raise_for_status
    from requests.exceptions import RequestException

    try:
        with get_session().get(url, headers={**headers, "Range": f"bytes=0-{n - 1}"}, stream=True,
                               timeout=30) as r:
            hf_raise_for_status(r)
            out = bytearray()
            for chunk in r.iter_content(chunk_size=min(n, 1 << 16)):
                out += chunk
                if len(out) >= n:
                    break
            return bytes(out[:n])
    except HfHubHTTPError:
        raise
    except RequestException as e:
        raise HubError(f"cannot read the header of {url}: {str(e).splitlines()[0]}") from None


# ---------------------------------------------------------------- download and check

def download(plan: HubPlan, stage: Path, log: Callable[[str], None]) -> Path:
    """Every file of the plan fetched (resuming) and checked; -> the GGUF file, or a directory under `stage` with
    exactly the repository files the build reads (links into the cache)."""
    if plan.spec.url:
        return _download_url(plan, log)
    paths = {f.path: plan.fetched.get(f.path) or fetch(plan, f, log) for f in plan.files}
    if plan.kind == "gguf":
        return paths[plan.files[0].path]
    out = stage / plan.name
    out.mkdir(parents=True, exist_ok=True)
    for rel, path in paths.items():
        (out / rel).symlink_to(path.resolve())
    return out


def fetch(plan: HubPlan, f: HubFile, log: Callable[[str], None]) -> Path:
    """One repository file into the cache (or the cached copy), checked against the hub's hashes."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from requests.exceptions import ChunkedEncodingError, ConnectionError, Timeout

    spec = plan.spec
    if plan.offline:
        path = plan.cached.get(f.path)
        if path is None:
            raise HubError(f"{spec.repo_id}/{f.path} is not in the Hugging Face cache and the hub is out of reach "
                           "(or HF_HUB_OFFLINE=1): pull it once online")
        return _checked(path, f, spec)
    if not plan.progress:
        log(f"pulling {f.path}" + (f" ({_size(f.size)})" if f.size else ""))
    for attempt in range(1, RETRIES + 1):
        try:
            path = Path(hf_hub_download(spec.repo_id, f.path, revision=spec.revision, endpoint=spec.endpoint))
            break
        except (ChunkedEncodingError, ConnectionError, Timeout, LocalEntryNotFoundError) as e:
            reason = str(e).splitlines()[0][:160]
            if attempt == RETRIES:
                raise HubError(f"downloading {spec.repo_id}/{f.path} from {_endpoint(spec)} failed {RETRIES} times "
                               f"({reason}); run the same command again: it resumes where it stopped") from None
            log(f"download of {f.path} interrupted ({reason}); resuming")
        except HfHubHTTPError as e:
            raise _refused(e, spec, f"{spec.repo_id}/{f.path}") from None
    return _checked(path, f, spec)


def _checked(path: Path, f: HubFile, spec: HubSpec) -> Path:
    """path if its content has the hub's size and hash; else the cached copy is removed and a HubError says so."""
    label = spec.url or f"{spec.repo_id}/{f.path}"
    size = path.stat().st_size
    if f.sha256:
        expected, actual, what = f.sha256, (sha256_file(path) if size == f.size or f.size is None else None), "sha256"
    elif f.git_oid:
        expected, actual, what = f.git_oid, _git_oid(path), "git blob id"
    else:
        return path
    if actual != expected or (f.size is not None and size != f.size):
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        got = f"{size} bytes" if actual is None else f"{what} {actual[:16]}..."
        raise HubError(f"{label} failed its {what} check (the server publishes {expected[:16]}..., "
                       f"{f.size} bytes; the download has {got}): the corrupted copy was removed; run the same "
                       "command again to download it anew")
    return path


def _git_oid(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


# ---------------------------------------------------------------- a plain URL

_PLAIN = {"Accept-Encoding": "identity"}      # no Authorization: HF_TOKEN goes to hub hosts only


def _url_file(url: str, downloads: Path) -> Path:
    return downloads / hashlib.sha256(url.encode()).hexdigest()[:16] / unquote(Path(urlparse(url).path).name)


def _resolve_url(spec: HubSpec, downloads: Path, progress: bool) -> HubPlan:
    """A GGUF at a plain URL: its size and, when the server publishes one, its sha256 (ETag / X-Linked-Etag);
    the architecture from its first bytes. A file downloaded before (and checked then) is taken as it is."""
    from huggingface_hub.utils import get_session
    from requests.exceptions import RequestException

    done = _url_file(spec.url, downloads)
    if done.is_file():
        with open(done, "rb") as fh:
            arch = gguf_architecture(lambda n: (fh.seek(0), fh.read(n))[1], str(done))
        f = HubFile(done.name, done.stat().st_size)
        return _url_plan(spec, arch, f, downloads, progress, {f.path: done})
    if _offline():
        raise HubError(f"offline mode is on (HF_HUB_OFFLINE=1) and {spec.url} was never downloaded: pull it once "
                       "online, or unset HF_HUB_OFFLINE")
    try:
        r = get_session().head(spec.url, headers=_PLAIN, allow_redirects=True, timeout=30)
    except RequestException as e:
        raise HubError(f"cannot reach {spec.url}: {str(e).splitlines()[0]}") from None
    if r.status_code >= 400:
        raise HubError(f"{spec.url} answered {r.status_code}" + (": no such file" if r.status_code == 404 else ""))
    etag = (r.headers.get("X-Linked-Etag") or r.headers.get("ETag") or "").removeprefix("W/").strip('"')
    size = r.headers.get("X-Linked-Size") or r.headers.get("Content-Length")
    name = unquote(Path(urlparse(spec.url).path).name)
    f = HubFile(name, int(size) if size else None, etag.lower() if re.fullmatch(r"[0-9a-fA-F]{64}", etag) else None)
    arch = gguf_architecture(lambda n: _range(spec.url, n, _PLAIN), spec.url)
    return _url_plan(spec, arch, f, downloads, progress, {})


def _url_plan(spec: HubSpec, arch: str | None, f: HubFile, downloads: Path, progress: bool, cached: dict) -> HubPlan:
    if arch is not None and arch not in GGUF_ARCHS:
        raise HubError(f"{spec.url} is a GGUF of architecture '{arch}', which ortllm does not build (supported: "
                       f"{', '.join(sorted(GGUF_ARCHS))}); nothing of its weights was downloaded")
    return HubPlan(spec, "gguf", [f], _default_name(spec, "gguf", [f]), downloads, progress, cached=cached)


def _download_url(plan: HubPlan, log: Callable[[str], None]) -> Path:
    """downloads/<sha256 of the URL, 16 hex>/NAME, written as NAME.incomplete and resumed from its length."""
    from huggingface_hub.file_download import http_get
    from requests.exceptions import ChunkedEncodingError, ConnectionError, RequestException, Timeout

    f, url = plan.files[0], plan.spec.url
    out = _url_file(url, plan.downloads)
    if f.path in plan.cached:
        return out
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".incomplete")
        if f.sha256 is None:
            log(f"{url} publishes no sha256: its size is checked, its content is not")
        elif not plan.progress:
            log(f"pulling {f.path}" + (f" ({_size(f.size)})" if f.size else ""))
        for attempt in range(1, RETRIES + 1):
            try:
                with open(part, "ab") as fh:
                    http_get(url, fh, resume_size=fh.tell(), headers=dict(_PLAIN), expected_size=f.size,
                             displayed_filename=f.path)
                break
            except (ChunkedEncodingError, ConnectionError, Timeout, OSError) as e:
                reason = str(e).splitlines()[0][:160]
                if not isinstance(e, RequestException):     # http_get's size check (an OSError)
                    part.unlink(missing_ok=True)
                    raise HubError(f"{url} sent a file of another size than it announced ({reason}); run the "
                                   "same command again") from None
                if attempt == RETRIES:
                    raise HubError(f"downloading {url} failed {RETRIES} times ({reason}); run the same command "
                                   "again: it resumes where it stopped") from None
                log(f"download of {f.path} interrupted ({reason}); resuming")
        os.replace(part, out)
    return _checked(out, f, plan.spec)
