"""Where experiment directories and score files live: a local path, `file://`, `s3://` or
`gs://` (`gcs://`), all read through `pyarrow.fs` (sweeps write to the same kinds of storage).
Any other scheme (`ftp://`, `hdfs://`, ...) is refused in one line wherever a location is
first read (`location`), so a sweep's `--storage` is refused before Ray starts.

A location is a `Path` (local paths and `file://` URIs) or a URI string (object storage).
This module is the one place that decides which: `location` (and `local_path`, for the code
that needs a directory on this machine: the experiment lock, the storage checks, demo data).
Where the user's text is read, it is read once into a `StorageLocation` (`parse`: the
filesystem, the path in it, the text passed on and the form shown), which every function
here takes as it is: a sweep's request carries one, so its checks and its launch enter
storage for I/O, never to read the same text again.
A `file://` URI is local everywhere, exactly like the plain path it names.
Credentials come from the usual places of each store (AWS_* / GOOGLE_* environment variables,
their config and profile files). An S3-compatible store on another endpoint (MinIO, moto, ...)
is reached by setting `AWS_ENDPOINT_URL` (e.g. `http://127.0.0.1:9000`, which Arrow reads), or
by putting Arrow's options in the URI itself:
`s3://bucket/dir?endpoint_override=127.0.0.1:9000&scheme=http` (the query is kept for every
file read below it). Credentials in an S3 URI itself, `s3://KEY:SECRET@bucket/dir` (the form
Arrow reads), are taken out of it where it is first read (`location`): they become this
process's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and the URI goes on without them, so
that no location this library passes on, writes or shows holds them (a sweep's trial configs,
Ray Tune's state, messages). A local Ray that a sweep starts inherits that environment, which
Ray writes nowhere (a `runtime_env` it logs in its session folder: Ray Tune is told not to copy
credentials into one, `relif_ray.tuning.tune_storage.keep_credentials_out_of_runtime_env`). Command
lines shown to the user drop them too (`redacted`). Reading never writes to the store.
"""

from __future__ import annotations

import errno
import functools
import io
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit
from urllib.request import url2pathname

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from relif_ray.errors import UserError, first_line

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")
_BUCKET_SCHEMES = ("s3", "gs", "gcs")
SUPPORTED = "a local path, file://, s3:// or gs://"
"""The kinds of storage, as a message names them."""
_LOCAL = pafs.LocalFileSystem()


@dataclass(frozen=True)
class StorageLocation:
    """A location read once from the user's text (`parse`), so that what follows enters
    storage for I/O only, never to parse the same text again: the pyarrow filesystem that
    holds it and its path there, `text` (an absolute local path, or the URI with its query
    options and without credentials: what the library passes on, to Ray and the trials) and
    `local` (the local directory; None in object storage). `join` keeps all of it."""

    text: str
    filesystem: pafs.FileSystem
    path: str
    local: Path | None

    def __str__(self) -> str:
        return self.text

    @property
    def display(self) -> str:
        """The location as shown to a user (`display`: no query options, no credentials)."""
        return display(self.local or self.text)

    def join(self, *names: str) -> StorageLocation:
        """`self / name / ...`, in the same filesystem."""
        path = "/".join([self.path.rstrip("/"), *names])
        if self.local is not None:
            local = self.local.joinpath(*names)
            return StorageLocation(str(local), self.filesystem, path, local)
        parts = urlsplit(self.text)
        text = urlunsplit(parts._replace(path="/".join([parts.path.rstrip("/"), *names])))
        return StorageLocation(text, self.filesystem, path, None)


Location = str | Path | StorageLocation
"""A local `Path`, the URI of a location in object storage, or either read once
(`StorageLocation`)."""


def parse(text: str | Path | StorageLocation, what: str = "") -> StorageLocation:
    """The location of a user's path or URI, read once (`location`, made absolute where it is
    local, and its filesystem: a bucket's is opened here, once): one-line errors as
    `location`'s, naming `what`."""
    if isinstance(text, StorageLocation):
        return text
    place = location(text, what)
    local = place.resolve() if isinstance(place, Path) else None
    store, path = filesystem(local or place)
    return StorageLocation(str(local or place), store, path, local)


def location(text: str | Path | StorageLocation, what: str = "") -> Location:
    """A path or URI as given by a user: `file://` URIs and plain paths become `Path`s; a URI
    of an unsupported scheme, or a bucket URI without a bucket, is a one-line error (`what`:
    the flag or argument that gave it, named first). Credentials in an S3 URI are taken out
    of it (`take_credentials`): the location returned never holds them."""
    if isinstance(text, StorageLocation):
        return text
    if isinstance(text, Path) or "://" not in text:
        return Path(text)
    parts = urlsplit(text)
    if parts.scheme == "file":
        return Path(url2pathname(parts.path))
    given = f"{what} {redacted(text)}" if what else redacted(text)
    if parts.scheme not in _BUCKET_SCHEMES:
        raise UserError(f"{given}: unsupported storage '{parts.scheme}://' (use {SUPPORTED})")
    if not _bucket(parts.netloc):
        raise UserError(f"{given}: no bucket named (expected {parts.scheme}://BUCKET/PATH)")
    if "@" in parts.netloc:
        take_credentials(parts, given)
        return urlunsplit(parts._replace(netloc=_bucket(parts.netloc)))
    return text


CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
"""Where the credentials of an S3 URI go: the environment variables that Arrow (this process's
and every Ray worker's) and every other S3 client read first."""


def take_credentials(parts: SplitResult, given: str) -> None:
    """The credentials of an S3 URI's `KEY:SECRET@` (percent-encoded, as Arrow reads them)
    become this process's `CREDENTIAL_VARIABLES`, in place of any there (and of a session token
    that went with those); filesystems opened before with other credentials are forgotten.
    A GCS URI takes none (Arrow's neither): GOOGLE_APPLICATION_CREDENTIALS names them."""
    if parts.scheme != "s3":
        raise UserError(
            f"{given}: a {parts.scheme}:// URI takes no credentials (set "
            "GOOGLE_APPLICATION_CREDENTIALS, or use the gcloud default credentials)"
        )
    key, colon, secret = parts.netloc.rpartition("@")[0].partition(":")
    if not (key and colon and secret):
        raise UserError(f"{given}: credentials in an s3:// URI are KEY:SECRET@ before the bucket")
    credentials = dict(zip(CREDENTIAL_VARIABLES, (unquote(key), unquote(secret)), strict=True))
    if any(os.environ.get(name) != value for name, value in credentials.items()):
        os.environ.update(credentials)
        os.environ.pop("AWS_SESSION_TOKEN", None)
        _bucket_filesystem.cache_clear()


_USERINFO = re.compile(r"\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@", re.IGNORECASE)
"""The `scheme://userinfo@` of a URI, wherever it stands in a text."""


def redacted(text: str) -> str:
    """`text` (a URI, a flag, a command line) with the userinfo of every URI in it left out:
    what a message or a command line shown to the user says of a location."""
    return _USERINFO.sub(r"\1", text)


def local_path(text: str | Path | StorageLocation, what: str = "") -> Path | None:
    """The absolute local directory of a plain path or `file://` URI; None for object storage
    (s3://, gs://), which has no local directory, no locks and no free-space checks."""
    if isinstance(text, StorageLocation):
        return text.local
    place = location(text, what)
    return place.resolve() if isinstance(place, Path) else None


def check_writable(text: str | Path, what: str) -> Path | None:
    """A local directory (a path or `file://` URI) must be one we can write into, or creatable
    below its nearest existing parent; nothing is created. Object storage is left to its
    store (its credentials are checked where it is first written). Returns the local path
    (None for object storage); one-line errors name `what`."""
    path = local_path(text, what)
    if path is None:
        return None
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    if not existing.is_dir():
        raise UserError(f"{what} {text}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {text}: {existing} is not writable")
    return path


def resolved(text: str | Path | StorageLocation) -> Location:
    """`location(text)`, made absolute where it is local (a sweep's storage as Ray gets it)."""
    if isinstance(text, StorageLocation):
        return text
    return local_path(text) or location(text)


def filesystem(place: Location) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding `place` and the path of `place` inside it."""
    if isinstance(place, StorageLocation):
        return place.filesystem, place.path
    place = location(place)  # any other URI than a bucket's is refused there
    if isinstance(place, Path):
        return _LOCAL, str(place.absolute())
    parts = urlsplit(place)
    try:
        query = f"?{parts.query}" if parts.query else ""
        store = _bucket_filesystem(f"{parts.scheme}://{parts.netloc}{query}")
        return store, f"{parts.netloc}{parts.path}".rstrip("/")
    except (OSError, pa.ArrowException) as error:
        raise UserError(f"{display(place)}: cannot open: {first_line(error)}") from error


@functools.lru_cache(maxsize=16)
def _bucket_filesystem(bucket_uri: str) -> pafs.FileSystem:
    """One filesystem object per bucket and options (creating one resolves the region). It
    holds no credentials of its own: Arrow finds them in the environment or profile when it
    is created (`take_credentials` forgets those created before it changes them), so that Ray
    Tune can pickle it into its state (`relif_ray.tuning.tune_storage.tune_storage`)."""
    return pafs.FileSystem.from_uri(bucket_uri)[0]


def join(place: Location, *names: str) -> Location:
    """`place / name / ...`, keeping a URI's query (its filesystem options)."""
    if isinstance(place, StorageLocation):
        return place.join(*names)
    if isinstance(place, Path):
        return place.joinpath(*names)
    parts = urlsplit(place)
    path = "/".join([parts.path.rstrip("/"), *names])
    return urlunsplit(parts._replace(path=path))


def parent(place: Location) -> Location:
    """The folder holding `place`."""
    if isinstance(place, StorageLocation):
        local = place.local.parent if place.local is not None else None
        text = str(local) if local is not None else str(parent(place.text))
        return StorageLocation(text, place.filesystem, place.path.rpartition("/")[0], local)
    if isinstance(place, Path):
        return place.parent
    parts = urlsplit(place)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/").rpartition("/")[0]))


def display(place: Location) -> str:
    """The location as shown to a user (a URI without its query options, and without the
    credentials of a URI's `ACCESS_KEY:SECRET_KEY@`, `redacted`)."""
    if isinstance(place, StorageLocation):
        return place.display
    if isinstance(place, Path):
        return str(place)
    return urlunsplit(urlsplit(redacted(place))._replace(query=""))


def _bucket(netloc: str) -> str:
    """The bucket of a URI's network location, without credentials given there."""
    return netloc.rpartition("@")[2]


def file_type(place: Location) -> pafs.FileType:
    store, path = filesystem(place)
    try:
        return store.get_file_info(path).type
    except OSError as error:
        raise UserError(f"{display(place)}: cannot read: {first_line(error)}") from error


LISTING_ATTEMPTS = 5
"""How often a listing is tried when a folder in it vanished while it was listed."""


def list_files(place: Location) -> dict[str, int]:
    """Every file below the directory `place`, as '/'-separated paths relative to it, in
    order, with its size in bytes (one recursive listing: a few requests on object storage
    however many trials there are). A running sweep deletes old checkpoint folders, and a local
    listing fails when one vanishes while it is listed: it is then listed again."""
    store, root = filesystem(place)
    selector = pafs.FileSelector(root, recursive=True)
    for attempt in range(1, LISTING_ATTEMPTS + 1):
        try:
            infos = store.get_file_info(selector)
            break
        except FileNotFoundError as error:
            if (
                attempt == LISTING_ATTEMPTS
                or store.get_file_info(root).type != pafs.FileType.Directory
            ):
                raise UserError(f"{display(place)}: cannot list: {first_line(error)}") from error
        except OSError as error:
            raise UserError(f"{display(place)}: cannot list: {first_line(error)}") from error
    prefix = root.rstrip("/") + "/"
    files = {info.path[len(prefix) :]: info.size for info in infos if info.is_file}
    return dict(sorted(files.items()))


class DamagedFile(UserError):
    """A file that exists but cannot be read as what it should be (cut off, empty, not its
    format, missing what it must hold): `path` (as shown) and `reason`, one line."""

    def __init__(self, place: Location, reason: str) -> None:
        self.path, self.reason = display(place), reason
        super().__init__(f"{self.path}: damaged file ({reason})")


@contextmanager
def reading(place: Location) -> Iterator[None]:
    """Where a file's content is parsed and checked: what a parser raises for bad content (a
    `ValueError`, which JSON, CSV, Arrow and text decoding errors are, a `KeyError` or
    `TypeError` of a missing or wrong entry) becomes `DamagedFile` naming the file. Every
    file of an experiment directory is read through here (`read_text`, `read_json`,
    `read_json_lines`, `read_csv`, `read_parquet`; `relif_ray.experiment.layout.check_file`
    reads a file by its name)."""
    try:
        yield
    except DamagedFile:
        raise
    except KeyError as error:
        raise DamagedFile(place, f"no entry {error}") from None
    except (ValueError, TypeError, pa.ArrowException) as error:
        raise DamagedFile(place, first_line(error, type(error).__name__)) from None


REREAD_PAUSES_S = (0.01, 0.03, 0.1, 0.3)
"""The pauses before each new read of a file that a running sweep may be rewriting."""


def read_settled(read: Callable[[], T], rewritten: bool) -> T:
    """`read()` of a file; where a running sweep may be rewriting it (`rewritten`), a read that
    finds it damaged is tried again a few times (`REREAD_PAUSES_S`). Ray Tune copies its
    records of every trial (`params.json`, `result.json`, `error.txt`) over the old ones at
    each snapshot of the experiment, so a reader can find one cut off for a moment."""
    for pause in REREAD_PAUSES_S if rewritten else ():
        try:
            return read()
        except DamagedFile:
            time.sleep(pause)
    return read()


def read_bytes(place: Location) -> bytes:
    store, path = filesystem(place)
    with store.open_input_stream(path) as stream:
        return stream.read()


def read_text(place: Location) -> str:
    """A UTF-8 text file."""
    data = read_bytes(place)
    with reading(place):
        return data.decode()


def read_json(place: Location) -> Any:
    """A JSON document."""
    data = read_bytes(place)
    with reading(place):
        return json.loads(data)


def read_json_lines(place: Location) -> list[dict[str, Any]]:
    """One JSON object per non-empty line (Tune's `result.json`)."""
    text = read_text(place)
    with reading(place):
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if not all(isinstance(record, dict) for record in records):
            raise ValueError("a line is not a JSON object")
        return records


def read_csv(place: Location) -> pd.DataFrame:
    """A CSV file with a header row, as pandas reads it, each float exactly as written (pandas
    writes the shortest repr that reads back as the same float; its default parser may read
    such a number one unit in the last place off)."""
    import pandas as pd  # deferred: the storage probe's Ray task imports this module

    data = read_bytes(place)
    with reading(place):
        return pd.read_csv(io.BytesIO(data), float_precision="round_trip")


def read_parquet(place: Location, **options: Any) -> pa.Table:
    """A parquet file as an arrow table (`options`: those of `pyarrow.parquet.read_table`)."""
    store, path = filesystem(place)
    with reading(place):
        return pq.read_table(path, filesystem=store, **options)


def write_text(place: Location, text: str) -> None:
    """Write a small text file (a sweep's record next to its trials) as a whole
    (`write_bytes_atomically`: a report read meanwhile never sees half of it)."""
    write_bytes_atomically(place, text.encode())


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""The errors of a write that failed for lack of space: a full disk, a full quota, a file-size
limit (`ulimit -f`)."""


class OutOfSpace(OSError):
    """A write that failed for lack of space (`NO_SPACE`), naming the file or folder written
    and the cause: `[Errno 28] No space left on device: '<file>'` (`writing`). OSError's own
    arguments, so that it pickles: a trial's error travels to the driver that way."""


def lack_of_space(error: BaseException) -> OSError | None:
    """The OSError of a write that failed for lack of space, raised as `error` or while it was
    handled: torch.save reports a failed write as a RuntimeError without the cause, raised
    while handling the file's OSError (its `__context__`)."""
    for candidate in (error, error.__context__):
        if isinstance(candidate, OSError) and candidate.errno in NO_SPACE:
            return candidate
    return None


@contextmanager
def writing(place: Location) -> Iterator[None]:
    """Where `place` is written: a write that fails for lack of space raises `OutOfSpace`
    naming it (pyarrow's and pandas' write errors name no file, torch's not even the cause);
    an `OutOfSpace` from within (a file of the folder `place`) stands."""
    try:
        yield
    except OutOfSpace:
        raise
    except Exception as error:
        cause = lack_of_space(error)
        if cause is None:
            raise
        raise OutOfSpace(cause.errno, os.strerror(cause.errno), display(place)) from error


def write_bytes_atomically(place: Location, data: bytes) -> None:
    """Replace a file as a whole: on a local disk a temporary file beside it renamed over it
    (readers never see half a file), on object storage one PUT."""
    if isinstance(place, StorageLocation) and place.local is not None:
        place = place.local
    if isinstance(place, Path):
        partial = place.with_name(f".{place.name}.partial")
        partial.write_bytes(data)
        partial.replace(place)
        return
    store, path = filesystem(place)
    with store.open_output_stream(path) as stream:
        stream.write(data)


def open_input(place: Location) -> pa.NativeFile:
    """A binary input stream (a context manager) for readers that take file objects."""
    store, path = filesystem(place)
    return store.open_input_file(path)


def storage_problem(probe: str, token: str) -> str | None:
    """Why the probe file that a sweep's driver wrote, holding `token`, is not usable on the
    node that runs this (None if it is): a multi-node sweep needs its local `--storage` to be
    one shared directory (`relif_ray.tuning.cluster.check_storage_visible` runs this as a Ray
    task on each node)."""
    path = Path(probe)
    if not path.exists():
        return "the directory is not visible there"
    if path.read_text() != token:
        return "a different directory of the same name is there"
    try:
        check = path.with_name(path.name + f".{uuid.uuid4().hex}")
        check.write_text(token)
        check.unlink()
    except OSError as exc:
        return f"not writable there ({exc.strerror})"
    return None
