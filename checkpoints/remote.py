"""The object-storage side of the checkpoint mirror: content-addressed blobs and per-checkpoint
manifests in one S3 bucket (any S3-compatible server).

  <prefix>/blobs/sha256/<hex>                 one checkpoint file, by the sha256 of its bytes;
                                              user metadata `sha256` and its size say what it is
  <prefix>/manifests/<game>/ckpt-<step>.json  the checkpoint's MANIFEST.json, written last: only
                                              after every blob it names is present and verified
  <prefix>/fences/<game>.json                 the game's placement fence (several hosts): the
                                              epoch of its newest placement; a writer of an
                                              older epoch commits and mirrors nothing

Object stores have no rename and no hard links: a file is uploaded once by its hash (the
hard-linked replay chunks of successive checkpoints share hashes), and a manifest appears only
when all of its blobs are there, so a reader never sees a checkpoint with a missing part. A
multipart ETag is not an MD5 of the bytes: blobs are verified by their size and their own
`sha256` metadata, and by hashing what is downloaded.

boto3 is imported here only, and only when a mirror is configured.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from checkpoints.errors import CheckpointError, PlacementFenced
from checkpoints.names import ckpt_name, ckpt_step

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_GAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}(/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}){0,2}")
_CHUNK = 1 << 20
_NOT_FOUND = ("404", "NoSuchKey", "NotFound")
_TOLERATED = object()  # what `_call` returns for a tolerated error code
_MAX_DETAIL = 400  # characters of a failure's detail in a message
# A ListObjectsV2 answer has at least one of these (S3 and every S3-compatible server tried
# send all of them); a web page that botocore parses as XML has none.
_LISTING_KEYS = frozenset({"Name", "IsTruncated", "MaxKeys", "KeyCount"})
_NOT_A_LISTING = "the answer is not an S3 bucket listing: is endpoint_url an S3 endpoint?"


class RemoteError(CheckpointError):
    """The object store refused or failed a request (after the client's own retries)."""


class RemoteContentError(RemoteError):
    """An object is missing or its bytes are not what its manifest says: proof against that
    one checkpoint (an older one may do), not a failure of the store."""


@dataclass(frozen=True)
class RemoteLocation:
    bucket: str
    prefix: str  # "" or "some/prefix/" (always ending in "/")

    @classmethod
    def parse(cls, url: str) -> RemoteLocation:
        """`s3://bucket[/prefix]`; raises ValueError naming what is wrong."""
        parsed = urlparse(url)
        if parsed.scheme != "s3":
            raise ValueError(f"mirror url {url!r} must start with s3://")
        bucket = parsed.netloc
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
            raise ValueError(
                f"mirror url {url!r}: {bucket!r} is not a valid S3 bucket name "
                "(3-63 lowercase letters, digits, dots and hyphens)"
            )
        parts = [p for p in parsed.path.split("/") if p]
        for part in parts:
            if part in (".", ".."):
                raise ValueError(f"mirror url {url!r}: the prefix may not contain {part!r}")
        return cls(bucket, "".join(f"{p}/" for p in parts))


@dataclass(frozen=True)
class TransferLimits:
    """s3transfer's bounds: memory ≈ concurrency x chunk size; bandwidth in bytes/s."""

    concurrency: int = 4
    chunk_bytes: int = 8 << 20
    bandwidth_bytes_s: int | None = None


def make_client(endpoint_url: str | None = None, region: str | None = None) -> Any:
    """A boto3 S3 client: endpoint, region and credentials from the standard AWS chain unless
    given; checksums only where the operation requires them (many S3-compatible servers refuse
    boto3's default CRC headers).

    Each client has its own session: boto3's default session resolves credentials once per
    process and keeps them, so a second client made after the environment's credentials changed
    signed with the first ones (and sessions are not safe to share between threads)."""
    import boto3.session
    from botocore.config import Config as BotoConfig

    cfg = BotoConfig(
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": "path"},
    )
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=cfg)


class RemoteStore:
    """Blobs and manifests of one mirror location."""

    def __init__(self, client: Any, where: RemoteLocation, limits: TransferLimits | None = None):
        from boto3.s3.transfer import TransferConfig

        self.client = client
        self.where = where
        lim = limits or TransferLimits()
        self.transfer = TransferConfig(
            multipart_threshold=lim.chunk_bytes,
            multipart_chunksize=lim.chunk_bytes,
            max_concurrency=lim.concurrency,
            max_bandwidth=lim.bandwidth_bytes_s,
            use_threads=lim.concurrency > 1,
        )

    # ---- keys ---------------------------------------------------------------------------

    def blob_key(self, sha256: str) -> str:
        if not _SHA256_RE.fullmatch(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return f"{self.where.prefix}blobs/sha256/{sha256}"

    def manifest_key(self, game: str, step: int) -> str:
        return f"{self._manifests(game)}{ckpt_name(step)}.json"

    def _manifests(self, game: str) -> str:
        if not _GAME_RE.fullmatch(game):
            raise ValueError(f"game name {game!r} cannot name a mirror folder")
        return f"{self.where.prefix}manifests/{game}/"

    # ---- requests -----------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The endpoint every request goes to, for messages: `endpoint_url`, or the one the
        client resolved from its region (AWS)."""
        meta = getattr(self.client, "meta", None)
        return str(getattr(meta, "endpoint_url", None) or "the default S3 endpoint")

    def error(self, what: str, detail: object, cls: type[RemoteError] = RemoteError) -> RemoteError:
        """`what` failed at this store's endpoint, in one line (a server's answer may hold
        newlines, or a whole web page): what an operator reads in `rlsup pull`, an event or
        error.json."""
        text = " ".join(str(detail).split()) or type(detail).__name__
        if len(text) > _MAX_DETAIL:
            text = text[: _MAX_DETAIL - 3] + "..."
        return cls(f"{what} at {self.endpoint}: {text}")

    def _call(self, what: str, fn: Any, *, tolerate: tuple[str, ...] = (), **kw: Any) -> Any:
        """fn(**kw); `_TOLERATED` when the store answers one of the `tolerate` error codes. A
        missing object is a RemoteContentError, any other failure a RemoteError, whatever the
        endpoint did (refused, timed out, answered something that is not S3)."""
        from botocore.exceptions import ClientError

        try:
            return fn(**kw)
        except ClientError as exc:
            if _code(exc) in tolerate:
                return _TOLERATED
            if _code(exc) in _NOT_FOUND:
                raise self.error(what, "not found", RemoteContentError) from exc
            raise self.error(what, exc) from exc
        except _endpoint_failures() as exc:
            raise self.error(what, exc) from exc

    def _read_body(self, what: str, resp: Any) -> bytes:
        """The whole body of a GET's answer (a connection may break mid-way)."""
        body = resp["Body"]
        try:
            return bytes(body.read())
        except _read_failures() as exc:
            raise self.error(what, exc) from exc
        finally:
            body.close()

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (owned by us already is fine)."""
        bucket = self.where.bucket
        missing = ("NoSuchBucket", *_NOT_FOUND)
        if (
            self._call(f"bucket {bucket}", self.client.head_bucket, tolerate=missing, Bucket=bucket)
            is _TOLERATED
        ):
            self._call(
                f"creating bucket {bucket}",
                self.client.create_bucket,
                tolerate=("BucketAlreadyOwnedByYou", "BucketAlreadyExists"),
                Bucket=bucket,
            )

    def has_blob(self, sha256: str, size: int) -> bool:
        """Present with this size and our sha256 metadata (a partial or foreign object is
        not the blob)."""
        head = self._call(
            f"HEAD blob {sha256[:12]}",
            self.client.head_object,
            tolerate=_NOT_FOUND,
            Bucket=self.where.bucket,
            Key=self.blob_key(sha256),
        )
        if head is _TOLERATED:
            return False
        meta = head.get("Metadata") or {}
        return int(head.get("ContentLength", -1)) == size and meta.get("sha256") == sha256

    def put_blob(self, path: Path, sha256: str) -> None:
        """Upload one file as the blob of `sha256` (the caller verified the bytes)."""
        self._call(
            f"uploading {path.name} as blob {sha256[:12]}",
            self.client.upload_file,
            Filename=str(path),
            Bucket=self.where.bucket,
            Key=self.blob_key(sha256),
            ExtraArgs={"Metadata": {"sha256": sha256}},
            Config=self.transfer,
        )

    def blob_chunks(self, sha256: str, size: int) -> Iterator[bytes]:
        """The blob's bytes in chunks; after the last one, RemoteError if its size or sha256
        is not what was asked for (the caller discards what it wrote)."""
        what = f"GET blob {sha256[:12]}"
        body = self._call(
            what, self.client.get_object, Bucket=self.where.bucket, Key=self.blob_key(sha256)
        )["Body"]
        digest, n = hashlib.sha256(), 0
        try:
            while True:
                try:
                    chunk = body.read(_CHUNK)
                except _read_failures() as exc:  # the connection broke
                    raise self.error(what, exc) from exc
                if not chunk:
                    break
                digest.update(chunk)
                n += len(chunk)
                yield chunk
        finally:
            body.close()
        if n != size or digest.hexdigest() != sha256:
            raise RemoteContentError(
                f"blob {sha256[:12]} is damaged: {n} bytes, sha256 {digest.hexdigest()[:12]} "
                f"(want {size} bytes, {sha256[:12]})"
            )

    def put_manifest(self, game: str, step: int, body: bytes) -> bool:
        """Write the manifest once (`If-None-Match: *`): False when it already exists."""
        done = self._call(
            f"PUT manifest {game}/{ckpt_name(step)}",
            self.client.put_object,
            tolerate=("PreconditionFailed", "412", "ConditionalRequestConflict"),
            Bucket=self.where.bucket,
            Key=self.manifest_key(game, step),
            Body=body,
            IfNoneMatch="*",
            ContentType="application/json",
        )
        return done is not _TOLERATED

    # ---- placement fences (several hosts) -------------------------------------------------

    def fence_key(self, game: str) -> str:
        if not _GAME_RE.fullmatch(game):
            raise ValueError(f"game name {game!r} cannot name a mirror object")
        return f"{self.where.prefix}fences/{game}.json"

    def get_fence(self, game: str) -> int:
        """The epoch of the game's newest placement (0: never placed with a fence)."""
        resp = self._call(
            f"GET fence {game}",
            self.client.get_object,
            tolerate=_NOT_FOUND,
            Bucket=self.where.bucket,
            Key=self.fence_key(game),
        )
        if resp is _TOLERATED:
            return 0
        raw = self._read_body(f"GET fence {game}", resp)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise self.error(f"fence of {game}", f"not JSON: {exc}", RemoteContentError) from exc
        epoch = data.get("epoch") if isinstance(data, dict) else None
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise self.error(f"fence of {game}", f"no epoch in {data!r}", RemoteContentError)
        return epoch

    def advance_fence(self, game: str, detail: dict[str, Any] | None = None) -> int:
        """A new placement of `game`: its fence moves one past the newest, which is returned.
        From then on a writer of any older epoch commits and mirrors nothing."""
        epoch = self.get_fence(game) + 1
        self._call(
            f"PUT fence {game}",
            self.client.put_object,
            Bucket=self.where.bucket,
            Key=self.fence_key(game),
            Body=json.dumps({**(detail or {}), "epoch": epoch}).encode(),
            ContentType="application/json",
        )
        return epoch

    def check_fence(self, game: str, epoch: int) -> None:
        """Raise PlacementFenced when the game was placed again after `epoch`."""
        fence = self.get_fence(game)
        if fence > epoch:
            raise PlacementFenced(game, epoch, fence)

    def get_manifest(self, game: str, step: int) -> bytes:
        what = f"GET manifest {game}/{ckpt_name(step)}"
        resp = self._call(
            what,
            self.client.get_object,
            Bucket=self.where.bucket,
            Key=self.manifest_key(game, step),
        )
        return self._read_body(what, resp)

    def delete(self, key: str) -> None:
        self._call(f"DELETE {key}", self.client.delete_object, Bucket=self.where.bucket, Key=key)

    def manifest_steps(self, game: str) -> list[int]:
        """The steps of the game's manifests, oldest first."""
        prefix = self._manifests(game)
        steps = []
        for key, _ in self._list(prefix):
            name = key[len(prefix) :]
            if name.endswith(".json") and (step := ckpt_step(name[: -len(".json")])) is not None:
                steps.append(step)
        return sorted(steps)

    def games(self) -> list[str]:
        """Every game with a manifest. A game's name may hold '/' (a matrix run, `pong/s2`):
        it is everything between `manifests/` and the manifest's own name."""
        prefix = f"{self.where.prefix}manifests/"
        games = set()
        for key, _ in self._list(prefix):
            game, _, name = key[len(prefix) :].rpartition("/")
            if game and name.endswith(".json") and ckpt_step(name[: -len(".json")]) is not None:
                games.add(game)
        return sorted(games)

    def blobs(self) -> dict[str, float]:
        """sha256 -> last-modified time (unix seconds) of every blob."""
        prefix = f"{self.where.prefix}blobs/sha256/"
        return {key[len(prefix) :]: ts for key, ts in self._list(prefix)}

    def _list(self, prefix: str) -> Iterator[tuple[str, float]]:
        """(key, last-modified) of every object under `prefix`. An answer that is not a bucket
        listing (a web page parses as XML too, with nothing in it) is a RemoteError, never an
        empty mirror: a fresh worker would start from zero."""
        from botocore.exceptions import ClientError

        what = f"listing {prefix}"
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.where.bucket, Prefix=prefix
            )
            for page in pages:
                if not _LISTING_KEYS & page.keys():
                    raise self.error(what, _NOT_A_LISTING)
                for obj in page.get("Contents") or []:
                    yield obj["Key"], obj["LastModified"].timestamp()
        except ClientError as exc:
            if _code(exc) == "NoSuchBucket":  # no bucket yet: nothing mirrored
                return
            raise self.error(what, exc) from exc
        except _endpoint_failures() as exc:
            raise self.error(what, f"not an S3 listing ({type(exc).__name__}: {exc})") from exc


def _endpoint_failures() -> tuple[type[Exception], ...]:
    """What a request can raise when the endpoint fails in any way: botocore's and boto3's own
    errors (connection refused, timeouts, retries exhausted), and what parsing an answer that
    is not S3 raises (botocore's parser, or its int()/timestamp conversions, or our own reading
    of a listing without keys). Asked only around client calls, never around local work."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError
    from botocore.parsers import ResponseParserError

    return (BotoCoreError, Boto3Error, ResponseParserError, ValueError, LookupError, TypeError)


def _read_failures() -> tuple[type[Exception], ...]:
    """Reading an answer's body: the endpoint's failures, and a connection that breaks."""
    return (*_endpoint_failures(), OSError)


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
