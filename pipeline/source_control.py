"""How a job runner holds or throttles a query that reads through the autoscaler-kafka source.

Two files, named by the source's options, carry the runner's requests to the source's planning on
the driver:
  pauseFile  while it exists, no trigger admits data; each such trigger touches `<pauseFile>.ack`,
             so its presence proves no batch follows (`pause_between_batches`,
             `stop_between_batches`, `clear_pause`).
  shareFile  holds a number s in (0, 1]: a micro-batch admits at most s x maxRecordsPerTrigger
             records (`write_share`, `read_share`); missing or unreadable means 1.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery


def pause_ack_path(pause_file: str | os.PathLike[str]) -> Path:
    """The file a paused source touches on every trigger it holds back."""
    return Path(f"{os.fspath(pause_file)}.ack")


def stop_between_batches(
    query: StreamingQuery, pause_file: str | os.PathLike[str], timeout: float = 60.0
) -> bool:
    """Stop a query that reads through this source after its in-flight micro-batch.

    Creates the pause file, waits until a trigger acknowledged it (that trigger admitted no data,
    so every batch before it is done and none follows) and no trigger is active, then stops the
    query. Returns False if the acknowledgement did not come within `timeout` (the query is
    stopped anyway; Spark redoes an interrupted batch on restart). The pause file is left in place.
    """
    acknowledged = pause_between_batches(query, pause_file, timeout)
    query.stop()
    return acknowledged


def pause_between_batches(query: StreamingQuery, pause_file: str | os.PathLike[str], timeout: float = 60.0) -> bool:
    """Hold a query that reads through this source between micro-batches, without stopping it.

    Creates the pause file and waits until a trigger acknowledged it and no trigger is active: every
    batch before is done and none runs until `clear_pause`. False if that did not happen within
    `timeout` (or the query stopped)."""
    ack = pause_ack_path(pause_file)
    ack.unlink(missing_ok=True)
    Path(pause_file).write_text(f"pause requested at {time.time()}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and query.isActive:
        if ack.exists() and not query.status.get("isTriggerActive", False):
            return True
        time.sleep(0.05)
    return False


def read_share(share_file: str | os.PathLike[str]) -> float:
    """The share of maxRecordsPerTrigger a batch admits now (`shareFile`): 1 when the file is
    missing or unreadable, else its number clipped to (0, 1]."""
    try:
        share = float(Path(share_file).read_text().strip())
    except (OSError, ValueError):
        return 1.0
    return min(1.0, share) if share > 0 else 1.0


def write_share(share_file: str | os.PathLike[str], share: float) -> None:
    """Set the share a batch admits (atomically: a trigger never reads half a number)."""
    path = Path(share_file)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{share:.6f}\n")
    tmp.replace(path)


def clear_pause(pause_file: str | os.PathLike[str]) -> None:
    Path(pause_file).unlink(missing_ok=True)
    pause_ack_path(pause_file).unlink(missing_ok=True)
