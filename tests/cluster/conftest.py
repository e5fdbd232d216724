"""The several-hosts tests share the mirror tests' SeaweedFS (one per module)."""

from tests.mirror.conftest import weed

__all__ = ["weed"]
