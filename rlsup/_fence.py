"""Several hosts (`[cluster] backend = "ray"`): the placement fence as the SDK honours it.

The host's actor starts a command game with the placement's epoch (`RLSUP_EPOCH`) and the
mirror it is fenced in (`RLSUP_MIRROR_URL`, `RLSUP_MIRROR_ENDPOINT_URL`, `RLSUP_MIRROR_REGION`).
Each checkpoint carries the epoch in its meta (a host the game comes back to tells its own
older checkpoints from the newer mirrored ones by it), and before each commit the game's fence
in the mirror is read: once it moved past this epoch (the game was placed again on another
host, this one declared lost), the checkpoint is not committed and the script exits 77
(FENCED), as rlsup's own worker does. A mirror that cannot be read cannot say so: the commit
goes on (said once on stderr), as rlsup's own worker does too.

boto3 (through checkpoints.remote) is imported only when the epoch is set: never on one host.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from training import protocol as P


class Fence:
    """The game's placement fence, or no fence (one host: `epoch` 0)."""

    def __init__(
        self,
        game: str,
        epoch: int,
        url: str,
        endpoint_url: str | None,
        region: str | None,
        say: Callable[[str], None],
    ) -> None:
        self.game, self.epoch, self.url = game, epoch, url
        self.endpoint_url, self.region = endpoint_url, region
        self._say = say
        self._remote: Any = None
        self._warned = False

    @classmethod
    def from_env(cls, game: str, epoch: int, say: Callable[[str], None]) -> Fence:
        """`epoch`: RLSUP_EPOCH as read by the caller (0: none); without a mirror, no fence."""
        url = os.environ.get(P.MIRROR_URL_ENV, "")
        if not url:
            epoch = 0
        return cls(
            game,
            epoch,
            url,
            os.environ.get(P.MIRROR_ENDPOINT_URL_ENV) or None,
            os.environ.get(P.MIRROR_REGION_ENV) or None,
            say,
        )

    @property
    def active(self) -> bool:
        return self.epoch > 0

    def check(self) -> None:
        """Raise checkpoints.errors.PlacementFenced when the game was placed again since this
        process started; an unreadable mirror (or no boto3) lets the commit go on."""
        if not self.active:
            return
        from checkpoints.errors import PlacementFenced

        try:
            if self._remote is None:
                from checkpoints.remote import RemoteLocation, RemoteStore, make_client

                client = make_client(self.endpoint_url, self.region)
                self._remote = RemoteStore(client, RemoteLocation.parse(self.url))
            self._remote.check_fence(self.game, self.epoch)
        except PlacementFenced:
            raise
        except Exception as exc:  # the mirror unreadable, boto3 missing: no verdict
            if not self._warned:
                self._warned = True
                self._say(
                    f"cannot read the placement fence of {self.game} in {self.url}: {exc}; "
                    "checkpoints are committed unchecked until it can be read"
                )
            return
        self._warned = False


def mirror_restore_from_env() -> dict[str, Any] | None:
    """What the host restored from the mirror before this process started, if anything."""
    raw = os.environ.get(P.MIRROR_RESTORE_ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
