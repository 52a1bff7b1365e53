"""Dead letters: every rejected input record, kept whole with the reason. Topic `autoscaler.dead-letter`."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from contracts.messages import Contract


class DeadLetter(Contract):
    """A rejected input record, kept whole. Topic `autoscaler.dead-letter`."""

    schema_version: Literal[1] = 1
    source_topic: str
    reason: str = Field(description="Short machine-readable reason, e.g. `malformed_json`, `oversize`.")
    detail: str = Field(description="Human-readable explanation (validation errors).")
    key: str | None = None
    payload_base64: str = Field(description="The original bytes, exactly (base64), unless truncated.")
    payload_preview: str = Field(description="The start of the payload as UTF-8 text, for people.")
    payload_bytes: int
    payload_truncated: bool = Field(description="Only payloads beyond the dead-letter size cap are cut.")
    partition: int | None = None
    offset: int | None = None
    rejected_at: float = Field(default_factory=time.time)
    stage: str = "monitor"


# Dead letters keep the rejected bytes whole up to this size (base64 grows them by a third and
# Kafka's default record limit is 1 MiB).
PAYLOAD_KEEP_BYTES = 700 * 1024
PREVIEW_CHARS = 512


@dataclass(frozen=True)
class Rejection:
    """Why an input record is not accepted: a machine-readable reason and an explanation."""

    reason: str
    detail: str


def dead_letter(
    topic: str,
    value: bytes | None,
    key: bytes | None,
    rejection: Rejection,
    stage: str,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    """The dead letter of a rejected record: the reason, and the original bytes kept whole (up to
    PAYLOAD_KEEP_BYTES) so that nothing is lost."""
    raw = value or b""
    return DeadLetter(
        source_topic=topic,
        reason=rejection.reason,
        detail=rejection.detail,
        key=None if key is None else key.decode("utf-8", "replace"),
        payload_base64=base64.b64encode(raw[:PAYLOAD_KEEP_BYTES]).decode(),
        payload_preview=raw[:PREVIEW_CHARS].decode("utf-8", "replace"),
        payload_bytes=len(raw),
        payload_truncated=len(raw) > PAYLOAD_KEEP_BYTES,
        stage=stage,
        partition=partition,
        offset=offset,
    )
