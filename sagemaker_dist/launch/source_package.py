"""Pack the user's source directory as ``sourcedir.tar.gz`` and upload it for ``sagemaker_submit_directory``.

The sagemaker-training toolkit in the container downloads that tarball, unpacks it and runs
``sagemaker_program`` from it. Packing is deterministic (sorted names, zeroed times and owners), so
the same sources give the same bytes and the same digest; every check runs before anything is uploaded.
Nothing from outside ``source_dir`` goes in: a linked file is packed as its content only if it points
inside, a hard link only if every name of its file is inside, and linked folders are not followed.
``DEFAULT_SOURCE_EXCLUDES`` leaves out caches, version control and the files that hold secrets by
convention (``.env*``, ``.netrc``, ``.aws/``, ``.ssh/``); the list is applied to what a link points at
too, so ``settings.txt -> .env`` stays out. ``exclude=`` replaces the list.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import os
import stat
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract.paths import contained_path
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.errors import ConfigurationError

TARBALL_NAME = "sourcedir.tar.gz"
MAX_SOURCE_BYTES = 500 * 1024 * 1024  # 500 MiB: more than this is data or a virtualenv, not code
# What is never packed unless ``exclude=`` says otherwise. ``name/``: a folder of that name anywhere;
# a pattern with no slash: a file name anywhere (fnmatch); ``a/b*``: the path from source_dir's root.
DEFAULT_SOURCE_EXCLUDES = (
    "__pycache__/", ".git/", ".ipynb_checkpoints/", ".mypy_cache/", ".pytest_cache/", "*.pyc", "*.pyo",
    ".env", ".env.*", ".envrc", ".netrc", ".aws/", ".ssh/",
)  # fmt: skip


class SourcePackageError(ConfigurationError):
    """The entry script or source directory cannot be packed for the training job."""


@dataclass(frozen=True)
class SourcePackage:
    """A packed source directory: where the tarball is, what it holds and its digest."""

    path: Path
    entry_point: str  # relative to the tarball root, as sagemaker_program expects
    files: tuple[str, ...]
    source_bytes: int
    sha256: str
    left_out: tuple[str, ...] = ()  # what the exclude list kept out (a folder once, as ``name/``)

    def left_out_line(self) -> str | None:
        """One line naming what the exclude list kept out of the tarball, or None."""
        if not self.left_out:
            return None
        more = len(self.left_out) - 12
        shown = ", ".join(self.left_out[:12]) + (f" and {more} more" if more > 0 else "")
        return (
            f"source_dir: left out of {TARBALL_NAME} by the exclude list (source_exclude= changes it): "
            + shown
        )


def _excluded_by(rel: PurePosixPath, is_dir: bool, patterns: Sequence[str]) -> bool:
    """Whether ``rel`` (a path inside source_dir) matches an exclude pattern (see DEFAULT_SOURCE_EXCLUDES)."""
    for pattern in patterns:
        if pattern.endswith("/"):
            folders = rel.parts if is_dir else rel.parts[:-1]
            if any(fnmatch.fnmatchcase(part, pattern[:-1]) for part in folders):
                return True
        elif "/" in pattern:
            if fnmatch.fnmatchcase(rel.as_posix(), pattern.lstrip("/")):
                return True
        elif not is_dir and fnmatch.fnmatchcase(rel.name, pattern):
            return True
    return False


def _included(rel: PurePosixPath, exclude: Sequence[str] = DEFAULT_SOURCE_EXCLUDES) -> bool:
    return not _excluded_by(rel, False, exclude)


def _names_by_file(source_dir: Path) -> dict[tuple[int, int], list[PurePosixPath]]:
    """Every name of each regular file under ``source_dir`` (links not followed), by (device, inode)."""
    names: dict[tuple[int, int], list[PurePosixPath]] = {}
    for root, _dirs, files in os.walk(source_dir, followlinks=False):
        for name in files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):  # the lstat taken says it: no second look through a link
                rel = PurePosixPath(Path(path).relative_to(source_dir).as_posix())
                names.setdefault((st.st_dev, st.st_ino), []).append(rel)
    return names


def collect_source_files(
    source_dir: Path, exclude: Sequence[str] = DEFAULT_SOURCE_EXCLUDES
) -> tuple[list[tuple[str, Path]], list[str]]:
    """``([(archive name, path)], left out)``: every file to pack, sorted by name, and what ``exclude``
    kept out. A linked file is packed as its content when it points inside ``source_dir`` and what it
    points at is not excluded; one that points outside is refused (it would carry a file from
    elsewhere, credentials say, into the job's S3 and container), and so is a hard link with a name
    outside. Linked folders are not followed."""
    found, left_out = [], []
    fix = "copy that file into source_dir, or make source_dir a folder that holds it"
    names = _names_by_file(source_dir)
    real_root = Path(os.path.realpath(source_dir))
    for root, dirs, files in os.walk(source_dir, followlinks=False):
        kept = []
        for d in sorted(dirs):
            rel = PurePosixPath(Path(root, d).relative_to(source_dir).as_posix())
            if _excluded_by(rel, True, exclude):
                left_out.append(f"{rel}/")
            else:
                kept.append(d)
        dirs[:] = kept
        for name in files:
            path = Path(root, name)
            rel = PurePosixPath(path.relative_to(source_dir).as_posix())
            if _excluded_by(rel, False, exclude):
                left_out.append(str(rel))
                continue
            if not path.is_file():
                continue
            if path.is_symlink():
                what = f"source_dir {str(source_dir)!r} holds the link"
                contained_path(source_dir, str(rel), what, fix=fix, error=SourcePackageError)
            st = path.stat()
            aliases = names.get((st.st_dev, st.st_ino), [])
            if st.st_nlink > len(aliases):
                raise SourcePackageError(
                    f"source_dir {str(source_dir)!r} holds {str(rel)!r}, a hard link whose file has "
                    f"{st.st_nlink} names, {st.st_nlink - len(aliases)} of them outside source_dir: it "
                    f"would carry a file from elsewhere into the job; {fix}"
                )
            target = PurePosixPath(Path(os.path.realpath(path)).relative_to(real_root).as_posix())
            if secret := next((n for n in [target, *aliases] if _excluded_by(n, False, exclude)), None):
                left_out.append(f"{rel} (the same file as {secret})")  # a link to what is excluded
            else:
                found.append((str(rel), path))
    return sorted(found), sorted(left_out)


def resolve_entry_point(
    entry_point: str | os.PathLike,
    source_dir: str | os.PathLike | None,
    exclude: Sequence[str] | None = None,
) -> tuple[Path, str]:
    """Return (source directory, entry script relative to it); raise if the script is not there.

    With no ``source_dir`` the script's own directory is returned, but ``pack_source`` packs only
    the script itself, as the SageMaker SDK does.
    """
    entry = Path(entry_point)
    if source_dir is None:
        if not entry.is_file():
            raise SourcePackageError(
                f"entry script {str(entry)!r} does not exist; pass the path of your training script "
                "(or source_dir= and the script's path inside it)"
            )
        return entry.resolve().parent, entry.name
    exclude = DEFAULT_SOURCE_EXCLUDES if exclude is None else tuple(exclude)
    src = Path(source_dir)
    if not src.is_dir():
        raise SourcePackageError(
            f"source_dir {str(src)!r} is not a directory; pass the folder holding your code"
        )
    if entry.is_absolute():
        try:
            entry = entry.resolve().relative_to(src.resolve())
        except ValueError:
            raise SourcePackageError(
                f"entry script {str(entry_point)!r} is outside source_dir {str(src)!r}; give its path "
                "relative to source_dir"
            ) from None
    rel = PurePosixPath(entry.as_posix())
    if ".." in rel.parts or not (src / rel).is_file():
        present = [name for name, _ in collect_source_files(src, exclude)[0] if name.endswith(".py")][:10]
        raise SourcePackageError(
            f"entry script {str(rel)!r} does not exist in source_dir {str(src)!r} "
            f"(Python files there: {', '.join(present) or 'none'}); give the script's path relative "
            "to source_dir"
        )
    if not _included(rel, exclude):
        raise SourcePackageError(
            f"entry script {str(rel)!r} is in an excluded location (the exclude list: {', '.join(exclude)}); "
            "move it, or pass source_exclude= without the pattern that matches it"
        )
    return src, str(rel)


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 * 1024 else f"{n / (1024 * 1024):.1f} MiB"


def check_source_size(files: list[tuple[str, Path]], source_dir: Path, max_bytes: int) -> int:
    """Total bytes of the files; raise before packing if over ``max_bytes`` (sizes from stat only)."""
    sizes = [(path.stat().st_size, name) for name, path in files]
    total = sum(size for size, _ in sizes)
    if total > max_bytes:
        largest = ", ".join(f"{name} ({_size(size)})" for size, name in sorted(sizes, reverse=True)[:3])
        raise SourcePackageError(
            f"source_dir {str(source_dir)!r} holds {_size(total)}, over the {_size(max_bytes)} "
            f"limit for code (largest: {largest}). Put data in S3 and pass it as input channels, or "
            "point source_dir at a folder with just your code."
        )
    return total


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.mode & 0o111 else 0o644
    return info


def pack_source(
    entry_point: str | os.PathLike,
    source_dir: str | os.PathLike | None = None,
    *,
    dest_dir: str | os.PathLike | None = None,
    max_bytes: int = MAX_SOURCE_BYTES,
    exclude: Sequence[str] | None = None,
    runtime_package: bool = False,
) -> SourcePackage:
    """Pack ``source_dir`` (or, without one, just the entry script) into ``dest_dir/sourcedir.tar.gz``.

    ``exclude``: patterns of what never goes in (default ``DEFAULT_SOURCE_EXCLUDES``).
    ``runtime_package``: add the sagemaker_dist package and its runtime's ``requirements.txt`` lines,
    for an image without it (``runtime_package.py``). Checks the entry script, links and the size
    first; writes to a temporary name and renames, so a half-written tarball never exists under the
    final name.
    """
    exclude = tuple(DEFAULT_SOURCE_EXCLUDES if exclude is None else exclude)
    src, entry = resolve_entry_point(entry_point, source_dir, exclude)
    files, left_out = (
        collect_source_files(src, exclude) if source_dir is not None else ([(entry, src / entry)], [])
    )
    total = check_source_size(files, src, max_bytes)
    written: dict[str, bytes] = {}  # archive name -> content made here
    if runtime_package:
        files, written = _with_runtime_package(files, src)
    dest = Path(dest_dir) if dest_dir is not None else Path(tempfile.mkdtemp(prefix="sagemaker-dist-src-"))
    dest.mkdir(parents=True, exist_ok=True)
    final = dest / TARBALL_NAME
    fd, tmp_name = tempfile.mkstemp(prefix=".sourcedir-", suffix=".tmp", dir=dest)
    try:
        with os.fdopen(fd, "wb") as raw:
            # mtime=0 and no file name in the gzip header keep the bytes reproducible.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                # dereference: a symlinked file is packed as its content, valid in the container.
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT, dereference=True) as tar:
                    for name, path in files:
                        if name in written:
                            info = _normalized(tarfile.TarInfo(name))
                            info.size = len(written[name])
                            tar.addfile(info, io.BytesIO(written[name]))
                        else:
                            tar.add(str(path), arcname=name, recursive=False, filter=_normalized)
        os.replace(tmp_name, final)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    digest = hashlib.sha256(final.read_bytes()).hexdigest()
    return SourcePackage(final, entry, tuple(name for name, _ in files), total, digest, tuple(left_out))


def _with_runtime_package(
    files: list[tuple[str, Path]], src: Path
) -> tuple[list[tuple[str, Path]], dict[str, bytes]]:
    """``files`` plus the sagemaker_dist package, with ``requirements.txt`` the user's and the runtime's."""
    from sagemaker_dist.launch import runtime_package

    names = dict(files)
    clash = sorted(n for n in names if n.split("/", 1)[0] == runtime_package.PACKAGE)
    if clash:
        raise SourcePackageError(
            f"source_dir {str(src)!r} holds {clash[0]!r}: the sagemaker_dist package travels in the "
            "tarball for an image without it, under that name. Rename that folder, or use an image that "
            "has the package (container/build_and_push.sh) and ship_package=False"
        )
    text = runtime_package.requirements_text(names.get(runtime_package.REQUIREMENTS))
    names[runtime_package.REQUIREMENTS] = src / runtime_package.REQUIREMENTS  # content: written below
    names.update(runtime_package.package_files())
    return sorted(names.items()), {runtime_package.REQUIREMENTS: text.encode()}


def upload_source(package: SourcePackage, s3_uri: str, client=None) -> str:
    """Upload the tarball to ``s3_uri`` (the full object URI) with the transfer manager; return the URI."""
    bucket, key = parse_s3_uri(s3_uri)
    if not key or key.endswith("/"):
        raise SourcePackageError(f"{s3_uri!r} names a prefix; give the object URI ending in {TARBALL_NAME}")
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    client = client or s3_client()
    try:
        client.upload_file(str(package.path), bucket, key, ExtraArgs={"Metadata": {"sha256": package.sha256}})
    except (S3UploadFailedError, ClientError, BotoCoreError) as exc:
        raise SourcePackageError(
            f"could not upload the source tarball to {s3_uri}: {exc}; check that the bucket exists, "
            "your credentials may write to it, and AWS_ENDPOINT_URL (if you use one)"
        ) from exc
    return s3_uri
