"""The cloud buckets a SkyPilot job can mount at launch.storage (launch.storage_bucket), as SkyPilot 0.14 takes them.

A VM that SkyPilot provisions has no shared file system: a managed job relaunched after a preemption
lands on a fresh VM, and several nodes share nothing. SkyPilot's answer is a bucket in the task's
`file_mounts` (docs.skypilot.co, reference/storage.html "Cloud Buckets"), mounted at the same path on
every node of every launch; gpuplan mounts it at launch.storage, where output.dir lives.

The mode is MOUNT_CACHED, fixed: the docs and SkyPilot's "High-performance checkpointing" post
(blog.skypilot.co/high-performance-checkpointing) give it for checkpoints: writes land on the VM's
disk and rclone uploads each closed file in the background (write-back), so a save costs disk time,
not upload time. MOUNT uploads a file as it is closed and, in the storage page's own note, "does not
support the full POSIX interface ... random writes and append operations are not supported"
(metrics.jsonl is appended to); COPY never writes back.
The price of write-back: a VM that dies right after a save can leave that checkpoint half uploaded,
so a run on a bucket sets such a checkpoint aside and resumes from the one before
(apply/train/checkpoints.py find_resumable).

The schemes are those SkyPilot 0.14's Storage accepts as a cloud source (sky/data/storage.py
Storage._validate_source) whose store has a MOUNT_CACHED command (each store's mount_cached_command);
two of its schemes are refused here, with the reason. A mounted source is a bucket, not a folder in
one: _validate_source refuses a path after the bucket in MOUNT modes ("MOUNT mode does not support
mounting specific files from cloud storage"), so the folder goes into output.dir instead.
"""

from __future__ import annotations

import re
import urllib.parse

MOUNT_MODE = "MOUNT_CACHED"

# scheme -> the SkyPilot store it names (sky/data/storage.py StoreType and its S3-compatible stores' url_prefix)
BUCKET_STORES: dict[str, str] = {
    "s3": "AWS S3",
    "gs": "Google Cloud Storage",
    "r2": "Cloudflare R2",
    "https": "Azure Blob Storage (https://ACCOUNT.blob.core.windows.net/CONTAINER)",
    "oci": "OCI Object Storage",
    "nebius": "Nebius Object Storage",
    "cw": "CoreWeave Object Storage",
    "vastdata": "VAST Data",
}
# schemes SkyPilot accepts as a source but cannot hold gpuplan's checkpoints
REFUSED_STORES: dict[str, str] = {
    "cos": "IBM COS has no MOUNT_CACHED mount in SkyPilot 0.14 (IBMCosStore.mount_cached_command raises NotSupportedError)",
    "hf": "a Hugging Face mount is hf-mount, without rclone's write-back (HuggingFaceStore.mount_cached_command), "
    "and repository mounts are read-only",
}
_AZURE_HOST = re.compile(r"^[a-z0-9]{3,24}\.blob\.core\.windows\.net$")


def bucket_problem(url: str) -> tuple[str, str] | None:
    """None when SkyPilot can mount `url` with MOUNT_CACHED; else (what is wrong, the fix)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    known = ", ".join(f"{s}://" for s in BUCKET_STORES)
    if scheme in REFUSED_STORES:
        return REFUSED_STORES[scheme], f"set launch.storage_bucket to a bucket on one of {known}"
    if scheme not in BUCKET_STORES or not parts.netloc:
        return f"it is not a bucket URL SkyPilot mounts (supported: {known})", 'set launch.storage_bucket = "s3://my-bucket" (your bucket)'
    if scheme == "https":  # Azure: the container is the first path segment (sky/data/data_utils.py split_az_path)
        container, _, rest = parts.path.strip("/").partition("/")
        if not _AZURE_HOST.match(parts.netloc) or not container:
            return "an https:// bucket is an Azure container, https://ACCOUNT.blob.core.windows.net/CONTAINER", (
                'set launch.storage_bucket = "https://myaccount.blob.core.windows.net/my-container" (your account and container)'
            )
        if rest:
            return _folder_problem(f"https://{parts.netloc}/{container}")
        return None
    if parts.path.strip("/"):
        return _folder_problem(f"{scheme}://{parts.netloc}")
    return None


def _folder_problem(bucket: str) -> tuple[str, str]:
    return (
        "it names a folder in a bucket, and SkyPilot mounts only a whole bucket (its MOUNT modes refuse a folder: "
        "sky/data/storage.py Storage._validate_source)",
        f'set launch.storage_bucket = "{bucket}" and put the folder in output.dir (under launch.storage)',
    )
