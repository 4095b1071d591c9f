"""Resolve a Hub id to a commit and a local file through huggingface_hub (imported here, lazily).

Planning reads only config.json of a model (hf_hub_download: the cache when it has the
file, else a download of that one file; HF_HUB_OFFLINE, HF_HOME / HF_HUB_CACHE and the
token in its standard places are huggingface_hub's own). A dataset is resolved to its
snapshot with only its card (README.md), the dataset's metadata. Every huggingface_hub
failure becomes a HubError that says what to do: fetch command, login, id or revision.

With no network, hf_hub_download of a file that is not cached does not give up at once: after its
first HEAD fails it asks again with retries (huggingface_hub 2.4 file_download.py, "No local file
found. Retrying..", retry_on_errors=True: 5 retries, 1+2+4+8+8 s, utils/_http.py _http_backoff_base),
23 s of "Retrying in 8s" per file. So a file not in the cache is first asked for once, with no
retry (get_hf_file_metadata, retry_on_errors=False); when the Hub cannot be reached that ends the
command with one message, and the rest of the process reads the cache only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpuplan.errors import Diagnostic, GpuplanError

# The CLI of huggingface_hub 1.x / 2.x is `hf` (`huggingface-cli` before 1.0).
CLI = "hf"
README = "README.md"


class HubError(GpuplanError):
    """A Hub id that cannot be resolved; the summary names the id and the revision, the fix the
    command that fixes it, when there is one."""

    def __init__(self, key: str, message: str, fix: str | None = None):
        super().__init__([Diagnostic("error", key, f"{key}: {message}", None, fix)])

    @property
    def message(self) -> str:
        return self.summary


@dataclass(frozen=True)
class HubRef:
    key: str  # spec key: "model.name_or_path" or "data.dataset"
    repo_id: str
    repo_type: str  # "model" | "dataset"
    revision: str  # as the spec writes it: branch, tag or commit
    commit: str  # the commit the plan uses
    current: str | None  # where `revision` points now (cache or Hub); None when unknown
    path: str  # model: its config.json; dataset: its snapshot directory
    locked: bool  # commit came from the lock file


def fetch_command(repo_id: str, repo_type: str, revision: str, files: tuple[str, ...] = ()) -> str:
    kind = " --repo-type dataset" if repo_type == "dataset" else ""
    return f"{CLI} download {repo_id}{''.join(' ' + f for f in files)} --revision {revision}{kind}"


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def repo_folder(repo_id: str, repo_type: str) -> str:
    """huggingface_hub's cache layout: <cache>/models--org--name (datasets--org--name)."""
    return os.path.join(cache_dir(), f"{repo_type}s--" + repo_id.replace("/", "--"))


def commit_of(path: str) -> str:
    """The commit of a file or folder under <repo>/snapshots/<commit>/."""
    parts = os.path.normpath(path).split(os.sep)
    return parts[parts.index("snapshots") + 1]


def _translate(e: Exception, key: str, repo_id: str, repo_type: str, revision: str, files: tuple[str, ...]) -> HubError:
    from huggingface_hub import errors

    what = f"{repo_type} {repo_id!r} at revision {revision!r}"
    login = f"log in with `{CLI} auth login` or set HF_TOKEN"
    if isinstance(e, errors.HFValidationError):  # huggingface_hub.utils._validators validate_repo_id
        return HubError(key, f'{repo_id!r} is not a Hub repo id ({e}); name a local path that exists, or a repo id such as "org/name"')
    if isinstance(e, errors.GatedRepoError):
        return HubError(
            key,
            f"{what} is gated: accept its terms on https://huggingface.co/"
            f"{'datasets/' if repo_type == 'dataset' else ''}{repo_id} and {login}",
            fix=f"{CLI} auth login",
        )
    if isinstance(e, errors.RepositoryNotFoundError):
        return HubError(key, f"{what}: no such repository, or it is private and your token cannot see it; check the id, or {login}")
    if isinstance(e, errors.RevisionNotFoundError):
        return HubError(key, f"{what}: no such branch, tag or commit; fix the revision key beside {key}")
    if isinstance(e, errors.LocalEntryNotFoundError) and e.__cause__ is not None and _network_failure(e.__cause__):
        _unreachable.append(f"{type(e.__cause__).__name__}: {e.__cause__}")  # snapshot_download: no answer, no cache
        return unreachable_error(key, repo_id, repo_type, revision, files, _unreachable[0])
    if isinstance(e, (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)):
        offline = (
            " (HF_HUB_OFFLINE is set)"
            if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "on", "yes")
            else " (the Hub could not be reached)"
        )
        need = ", ".join(files) if files else "the snapshot"
        command = fetch_command(repo_id, repo_type, revision, files)
        return HubError(
            key, f"{what}: {need} is not in the cache {repo_folder(repo_id, repo_type)}{offline}; fetch it with `{command}`", fix=command
        )
    if isinstance(e, errors.EntryNotFoundError):
        return HubError(key, f"{what} has no {', '.join(files)}; is it a transformers {repo_type}?")
    if isinstance(e, errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            return HubError(key, f"{what}: the Hub refused access (HTTP {status}); {login}")
        return HubError(key, f"{what}: the Hub answered {status}: {str(e).splitlines()[0]}")
    return HubError(key, f"{what}: {type(e).__name__}: {e}")


# Why the Hub could not be reached, once it could not: the rest of the process asks it nothing more.
_unreachable: list[str] = []


def _network_failure(e: BaseException) -> bool:
    """No answer from the Hub at all (DNS, refused, timeout, proxy): httpx2's transport errors, which
    huggingface_hub lets through from get_hf_file_metadata (huggingface_hub depends on httpx2)."""
    import httpx2

    return isinstance(e, httpx2.TransportError)


def unreachable_error(key: str, repo_id: str, repo_type: str, revision: str, files: tuple[str, ...], why: str) -> HubError:
    from huggingface_hub import constants

    what = f"{repo_type} {repo_id!r} at revision {revision!r}"
    need = ", ".join(files) if files else "its snapshot"
    command = fetch_command(repo_id, repo_type, revision, files)
    return HubError(
        key,
        f"{what}: {need} is not in the cache {repo_folder(repo_id, repo_type)}, and the Hub ({constants.ENDPOINT}) "
        f"cannot be reached: {why}",
        fix=f"on a machine that reaches the Hub, fetch it: `{command}` (into this cache, or copy the cache here); "
        "then HF_HUB_OFFLINE=1 plans from the cache alone, without asking the Hub",
    )


def check_reachable(key: str, repo_id: str, repo_type: str, revision: str, filename: str) -> None:
    """Ask the Hub once, with no retries, for `filename`; HubError when no answer comes at all.
    Any answer (the file, 404, 401, gated) means the Hub is there: the download itself says what it is."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    if _unreachable:
        raise unreachable_error(key, repo_id, repo_type, revision, (filename,), _unreachable[0])
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, filename, repo_type=repo_type, revision=revision), timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except Exception as e:
        if not _network_failure(e):
            return
        _unreachable.append(f"{type(e).__name__}: {e}")
        raise unreachable_error(key, repo_id, repo_type, revision, (filename,), _unreachable[0]) from None


def _cached(repo_id: str, repo_type: str, revision: str, filename: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, filename, revision=revision, repo_type=repo_type), str)


def download_file(key: str, repo_id: str, repo_type: str, revision: str, filename: str) -> str:
    """Local path of one file of the repo at `revision` (cache first, then the Hub)."""
    from huggingface_hub import constants, hf_hub_download

    try:
        cached = _cached(repo_id, repo_type, revision, filename)  # validates repo_id (HFValidationError)
    except Exception as e:
        raise _translate(e, key, repo_id, repo_type, revision, (filename,)) from None
    if not cached and not constants.HF_HUB_OFFLINE:
        check_reachable(key, repo_id, repo_type, revision, filename)
    try:
        # a cached file: one HEAD for where `revision` points now, falling back to the cache at once
        return hf_hub_download(repo_id, filename, repo_type=repo_type, revision=revision, local_files_only=bool(_unreachable))
    except Exception as e:  # huggingface_hub raises OSError, ValueError and HTTP subclasses: all translated
        raise _translate(e, key, repo_id, repo_type, revision, (filename,)) from None


def snapshot(key: str, repo_id: str, repo_type: str, revision: str, patterns: list[str], local_only: bool = False) -> str:
    """Local snapshot folder holding the files matching `patterns` (downloaded unless cached)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(
            repo_id, repo_type=repo_type, revision=revision, allow_patterns=patterns, local_files_only=local_only or bool(_unreachable)
        )
    except Exception as e:  # see download_file
        raise _translate(e, key, repo_id, repo_type, revision, ()) from None


def ref_in_cache(repo_id: str, repo_type: str, revision: str) -> str | None:
    """The commit the cache's refs/<revision> names (None: not cached, or revision is a commit)."""
    try:
        with open(os.path.join(repo_folder(repo_id, repo_type), "refs", revision), encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def resolve(key: str, repo_id: str, repo_type: str, revision: str, locked_commit: str | None) -> HubRef:
    """The commit to use (the locked one, else where `revision` points) and the file planning reads."""
    first = "config.json" if repo_type == "model" else README
    current: str | None
    try:
        if repo_type == "model":
            current = commit_of(download_file(key, repo_id, repo_type, revision, first))
        else:
            current = commit_of(snapshot(key, repo_id, repo_type, revision, [first]))
    except HubError:
        if locked_commit is None:
            raise
        current = ref_in_cache(repo_id, repo_type, revision)  # the locked commit may still be cached
    commit = locked_commit or current
    assert commit is not None
    if repo_type == "model":
        path = download_file(key, repo_id, repo_type, commit, first)
    else:
        path = snapshot(key, repo_id, repo_type, commit, [first])
    return HubRef(key, repo_id, repo_type, revision, commit, current, path, locked_commit is not None)
