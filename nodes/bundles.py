"""Diagnostic bundles (PROTOCOL.md "Diagnostic bundles", DESIGN.md "Evidence before the act").

    bundle = do_request_bundle(node, reason="before repair #12 (reboot)")  # collect_bundle
    answer = receive_upload(bundle_id, authorization, content_length, digest, body)
    settle(bundle)                                   # failed once its command failed
    do_download_bundle(bundle, actor=...)            # an open file, the download audited
    prune_bundles()                                  # beat: delete them after the retention

An upload is hostile input. It is answered by the table of PROTOCOL.md, and nothing is stored
unless every check passes: the node's own token, an id asked of that node, a Content-Length
within the bundle's max_bytes, the body streamed to a temporary file in chunks (never read
whole into memory) with its SHA-256 computed on the way and compared with the header, and a
listing of the tar file that stops at the first entry breaking the rules (outside
`<node>/`, not a plain file, more than 64 files beside the manifest, more unpacked bytes
than CLUSTERUI_BUNDLE_MAX_UNPACKED_BYTES), so a gzip bomb is refused, not expanded.
"""

import hashlib
import re
import tarfile
import tempfile
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import PurePosixPath

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.files import File
from django.core.files.storage import storages
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from clusters.services import record_audit

from .models import AgentCommand, AgentToken, DiagnosticBundle, Node
from .services import do_send_command, hash_token

CHUNK = 64 * 1024
MAX_FILES = 64  # beside <node>/manifest.json
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class UploadAnswer:
    status: int
    message: str


def storage():
    """Where bundles are kept (settings STORAGES["bundles"]: a folder, or a bucket)."""
    return storages["bundles"]


def upload_url(bundle):
    return f"/agent/bundles/{bundle.public_id}/"


@transaction.atomic
def do_request_bundle(node: Node, *, reason, actor: AbstractBaseUser | None = None,
                      request: HttpRequest | None = None,
                      now: datetime | None = None) -> DiagnosticBundle:
    """Ask the node's agent for a bundle (a collect_bundle command). One that was asked and
    is still being collected is returned instead of asking again. `actor` None: a repair."""
    now = now or timezone.now()
    node = Node.objects.select_for_update(no_key=True).get(pk=node.pk)
    pending = (DiagnosticBundle.objects.filter(node=node, status=DiagnosticBundle.Status.REQUESTED,
                                               command__status__in=AgentCommand.UNFINISHED)
               .first())
    if pending is not None:
        return pending
    deadline_s = settings.CLUSTERUI_BUNDLE_DEADLINE_S
    bundle = DiagnosticBundle.objects.create(
        node=node, reason=reason[:200], requested_by=actor, requested_at=now,
        max_bytes=settings.CLUSTERUI_BUNDLE_MAX_BYTES, deadline_s=deadline_s)
    bundle.command = do_send_command(
        node, AgentCommand.Action.COLLECT_BUNDLE, actor=actor, request=request, now=now,
        # The agent gives up at deadline_s; the command has a minute more to say so.
        deadline_s=deadline_s + 60,
        params={"bundle_id": str(bundle.public_id), "upload_url": upload_url(bundle),
                "max_bytes": bundle.max_bytes, "deadline_s": deadline_s})
    bundle.save(update_fields=["command"])
    return bundle


def settle(bundle, now=None):
    """A requested bundle whose command failed or timed out, or that is past its deadline,
    is marked not sent, with why. Returns the bundle as stored."""
    now = now or timezone.now()
    if bundle.status != DiagnosticBundle.Status.REQUESTED:
        return bundle
    command = AgentCommand.objects.filter(pk=bundle.command_id).first()
    why = ""
    if command is not None and command.status in (AgentCommand.Status.FAILED,
                                                  AgentCommand.Status.TIMED_OUT):
        why = f"the agent's answer: {command.get_status_display()}" + (
            f": {command.message}" if command.message else "")
    elif now > bundle.requested_at + timedelta(seconds=bundle.deadline_s):
        why = f"the agent sent none within {bundle.deadline_s} s"
    if why:
        DiagnosticBundle.objects.filter(pk=bundle.pk, status=DiagnosticBundle.Status.REQUESTED
                                        ).update(status=DiagnosticBundle.Status.FAILED,
                                                 message=why[:500])
        bundle.refresh_from_db()
    return bundle


def receive_upload(bundle_id, authorization, content_length, digest, body, now=None):
    """Take an agent's POST /agent/bundles/<bundle_id>/; its UploadAnswer. `body` is the
    request as a file (read in chunks); content_length and digest the headers' values."""
    now = now or timezone.now()
    plaintext = (authorization or "").removeprefix("Bearer ").strip()
    token = (AgentToken.objects.usable(now).filter(token_hash=hash_token(plaintext),
                                                   kind=AgentToken.Kind.NODE).first()
             if plaintext else None)
    if token is None:
        return UploadAnswer(401, "a valid node token is required")
    try:
        public_id = uuid.UUID(str(bundle_id))
    except ValueError:
        return UploadAnswer(404, "no such bundle")
    bundle = (DiagnosticBundle.objects.select_related("node").filter(public_id=public_id)
              .exclude(status=DiagnosticBundle.Status.EXPIRED).first())
    if bundle is None:
        return UploadAnswer(404, "no such bundle was asked for")
    if bundle.node_id != token.node_id:
        return UploadAnswer(403, "this bundle was asked of another node")
    try:
        length = int(content_length)
    except (TypeError, ValueError):
        return UploadAnswer(411, "Content-Length is required")
    if length < 0:
        return UploadAnswer(411, "Content-Length is required")
    if length > bundle.max_bytes:
        return UploadAnswer(413, f"{length} bytes is over this bundle's {bundle.max_bytes}")
    digest = (digest or "").strip().lower()
    if not SHA256.match(digest):
        return UploadAnswer(422, "X-Content-SHA256 must be the body's hex SHA-256")
    with tempfile.TemporaryFile() as spool:
        received, computed = _spool(body, length, spool)
        if received != length:
            return UploadAnswer(400, f"the body has {received} bytes, not the {length} of its "
                                     f"Content-Length")
        if computed != digest:
            return UploadAnswer(422, "the body's SHA-256 does not match X-Content-SHA256")
        if bundle.status == DiagnosticBundle.Status.STORED:
            return _again(bundle, computed)
        spool.seek(0)
        try:
            listing = list_bundle(spool, bundle.node.name)
        except BundleRefused as refused:
            return UploadAnswer(422, f"not a bundle: {refused}")
        spool.seek(0)
        return _store(bundle, spool, length, computed, listing, now)


def _spool(body, length, spool):
    """Copy at most `length` bytes of body (the server reads no further than its
    Content-Length) into spool: (bytes copied, their SHA-256)."""
    sha = hashlib.sha256()
    received = 0
    while received < length:
        chunk = body.read(min(CHUNK, length - received))
        if not chunk:
            break
        sha.update(chunk)
        spool.write(chunk)
        received += len(chunk)
    return received, sha.hexdigest()


def _again(bundle, computed):
    if computed == bundle.sha256:
        return UploadAnswer(200, "already stored")
    return UploadAnswer(409, "another bundle is already stored under this id")


def _store(bundle, spool, length, computed, listing, now):
    with transaction.atomic():
        bundle = DiagnosticBundle.objects.select_for_update().select_related(
            "node__cluster").get(pk=bundle.pk)
        if bundle.status == DiagnosticBundle.Status.STORED:  # a concurrent upload won
            return _again(bundle, computed)
        bundle.stored_as = storage().save(
            f"{bundle.node.cluster.slug}/{bundle.node.name}/{bundle.public_id}.tar.gz",
            File(spool))
        bundle.status = DiagnosticBundle.Status.STORED
        bundle.size_bytes = length
        bundle.sha256 = computed
        bundle.stored_at = now
        bundle.listing = listing
        bundle.unpacked_bytes = sum(entry["size"] for entry in listing)
        bundle.message = ""
        bundle.save()
    return UploadAnswer(201, "stored")


class BundleRefused(Exception):
    """The tar file breaks PROTOCOL.md's rules; str() says which."""


def list_bundle(file, node_name):
    """[{name, size}] of a bundle's files, read as a stream, refusing (BundleRefused) at the
    first entry that breaks the rules; the unpacked size counted from the headers before
    any data is read, so a bomb stops at its first oversized header."""
    limit = settings.CLUSTERUI_BUNDLE_MAX_UNPACKED_BYTES
    listing, unpacked = [], 0
    try:
        with tarfile.open(fileobj=file, mode="r|gz") as tar:
            for member in tar:
                path = PurePosixPath(member.name)
                if (path.is_absolute() or ".." in path.parts or len(path.parts) < 2
                        or path.parts[0] != node_name):
                    raise BundleRefused(f"{member.name!r} is not under {node_name}/")
                if not member.isreg():
                    raise BundleRefused(f"{member.name!r} is not a plain file")
                unpacked += member.size
                if unpacked > limit:
                    raise BundleRefused(f"it unpacks to more than {limit} bytes")
                listing.append({"name": member.name, "size": member.size})
                if len(listing) > MAX_FILES + 1:
                    raise BundleRefused(f"more than {MAX_FILES} files beside the manifest")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise BundleRefused(f"not a gzip-compressed tar file ({exc})") from None
    if not any(entry["name"] == f"{node_name}/manifest.json" for entry in listing):
        raise BundleRefused(f"it has no {node_name}/manifest.json")
    return listing


def do_download_bundle(bundle, *, actor: AbstractBaseUser, request: HttpRequest | None = None,
                       now: datetime | None = None):
    """The stored bundle's file, opened for reading; the download is audited."""
    record_audit(actor, "diagnosticbundle.download", bundle, cluster=bundle.node.cluster,
                 request=request, now=now,
                 changes={"node": bundle.node.name, "sha256": bundle.sha256,
                          "size_bytes": bundle.size_bytes})
    return storage().open(bundle.stored_as, "rb")


def prune_bundles(now=None):
    """Beat, hourly: stored bundles older than CLUSTERUI_BUNDLE_RETENTION_DAYS are deleted
    from the storage; their row stays, expired, with its digest. Returns how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_BUNDLE_RETENTION_DAYS)
    old = DiagnosticBundle.objects.filter(status=DiagnosticBundle.Status.STORED,
                                          stored_at__lt=cutoff)
    pruned = 0
    for bundle in old:
        storage().delete(bundle.stored_as)
        DiagnosticBundle.objects.filter(pk=bundle.pk).update(
            status=DiagnosticBundle.Status.EXPIRED, stored_as="",
            message=f"deleted after {settings.CLUSTERUI_BUNDLE_RETENTION_DAYS} days")
        pruned += 1
    return pruned
