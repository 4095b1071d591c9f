"""Whether a spec value names a Hub repo rather than a local path (pure, no imports of huggingface_hub)."""

from __future__ import annotations

import re
from pathlib import Path

# huggingface_hub.utils._validators REPO_ID_REGEX: an optional namespace, a name of
# word characters, "-" and "."; "--" and ".." are not allowed anywhere. ASCII as theirs is
# (re.ASCII): "\w" alone would take "¹" or "é", which validate_repo_id refuses (HFValidationError).
_REPO_ID = re.compile(r"^(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b$", re.ASCII)


def looks_like_repo_id(value: str) -> bool:
    return bool(_REPO_ID.match(value)) and "--" not in value and ".." not in value and not value.endswith(".git")


def is_hub_id(value: str, spec_dir: Path) -> bool:
    """A value is a Hub id when no such local path exists and it has a repo id's shape.

    Local paths win: "models/tiny" next to the spec stays a directory.
    """
    if value.startswith(("/", ".", "~")) or not looks_like_repo_id(value):
        return False
    try:
        return not (spec_dir / value).exists()
    except OSError:  # a name the file system refuses is no local path
        return True
