"""The sagemaker_dist package in the source tarball, for a training image that lacks it.

Our images (``container/build_and_push.sh``: ``sagemaker-dist`` for TensorFlow, ``sagemaker-dist-pytorch``
for torchrun) carry the package, its compiled readers and an entry point that forwards SIGTERM to the
ranks. A plain AWS DLC has none of them: a script there stops at ``import sagemaker_dist``. So for such
an image the package's own files go into ``sourcedir.tar.gz`` beside the script (the toolkit runs the
script from that folder, which is first on ``sys.path``), and ``requirements.txt`` names what its runtime
needs (``crc32c``, ...): AWS's toolkit installs it with pip before the script runs
(``sagemaker_training.entry_point.install``). The compiled readers are not carried: the runtime takes
its numpy and Python paths there.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path, PurePosixPath

from sagemaker_dist.errors import ConfigurationError

PACKAGE = "sagemaker_dist"
DISTRIBUTION_NAME = "sagemaker-dist"
REQUIREMENTS = "requirements.txt"
# what the runtime imports beyond the standard library, as setup.py pins them (the base and "runtime")
_RUNTIME_EXTRA = "runtime"
_SOURCE_SUFFIXES = (".py", ".h", ".cc", ".c")
# our images' repositories (container/build_and_push.sh); another name is taken for a plain image
_OUR_REPOSITORY = re.compile(r"(^|/)sagemaker-dist(-[a-z0-9]+)*(:|@|$)")


def is_sagemaker_dist_image(image_uri: str) -> bool:
    """Whether ``image_uri`` names one of our images by its repository (``.../sagemaker-dist[-*]:tag``)."""
    return bool(_OUR_REPOSITORY.search(image_uri.rsplit("/", 1)[-1]))


def runtime_requirements() -> list[str]:
    """The runtime's requirements as the installed distribution pins them (setup.py: the base
    requirements and the ``runtime`` extra), without markers, in order, once each."""
    try:
        declared = importlib.metadata.requires(DISTRIBUTION_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(
            f"{DISTRIBUTION_NAME} is not installed (pip install -e .), so its runtime requirements are "
            "unknown; pass the image built by container/build_and_push.sh as image_uri"
        ) from None
    out: list[str] = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        marker = marker.replace(" ", "")
        if (not marker or marker == f'extra=="{_RUNTIME_EXTRA}"') and requirement.strip() not in out:
            out.append(requirement.strip())
    return out


def package_files() -> list[tuple[str, Path]]:
    """(archive name, path) of the installed package's sources: ``sagemaker_dist/...``, sorted."""
    root = Path(__file__).resolve().parents[1]
    files = [
        (str(PurePosixPath(PACKAGE, path.relative_to(root).as_posix())), path)
        for path in root.rglob("*")
        if path.is_file() and path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts
    ]
    return sorted(files)


def requirements_text(user_requirements: Path | None) -> str:
    """``requirements.txt`` for the tarball: the user's lines (if any), then the runtime's."""
    user = user_requirements.read_text() if user_requirements is not None else ""
    lines = [user.rstrip("\n")] if user.strip() else []
    lines.append(f"# {DISTRIBUTION_NAME}'s runtime (its package travels in this tarball)")
    lines += runtime_requirements()
    return "\n".join(lines) + "\n"
