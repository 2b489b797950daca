"""A real S3-compatible server for the remote tests: moto's ``ThreadedMotoServer`` on 127.0.0.1 (a free port),
plus a TCP ``FaultProxy`` in front of it that can slow or swallow responses.

``S3Server.start()`` once per session (conftest's ``s3_server`` fixture); ``reset()`` between tests (moto's
``/moto-api/reset``); ``upload_dir`` copies a local tree into a bucket. Servers started in this process share
moto's in-memory buckets, so ``second()`` gives another server on another port over the same objects (one a
test may stop).
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
import urllib.request

BUCKET = "zephon-test"
_REQUEST_LINE = re.compile(rb"(?:^|\r\n)(GET|HEAD|PUT|POST|DELETE) (\S+) HTTP/1\.[01]\r\n")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    """One ThreadedMotoServer. endpoint: ``http://127.0.0.1:<port>``."""

    def __init__(self, server):
        self.server = server
        host, port = server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.stopped = False

    @classmethod
    def start(cls) -> "S3Server":
        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
        srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        srv.start()
        return cls(srv)

    def second(self) -> "S3Server":
        """Another server over the same in-memory buckets (to be stopped by a test)."""
        return S3Server.start()

    def stop(self) -> None:
        if not self.stopped:
            self.server.stop()
            self.stopped = True

    def reset(self) -> None:
        """Forget every bucket and object (moto's reset API)."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def client(self, endpoint: str | None = None):
        import boto3
        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def upload_dir(self, local: str, prefix: str, bucket: str = BUCKET) -> str:
        """Upload every file under ``local`` (hidden ones too) to ``s3://bucket/prefix/...``; returns that URL."""
        c = self.client()
        for root, _dirs, files in os.walk(local):
            for f in files:
                full = os.path.join(root, f)
                rel = os.path.relpath(full, local).replace(os.sep, "/")
                c.upload_file(full, bucket, f"{prefix}/{rel}")
        return f"s3://{bucket}/{prefix}"

    def upload_file(self, local: str, key: str, bucket: str = BUCKET) -> str:
        self.client().upload_file(local, bucket, key)
        return f"s3://{bucket}/{key}"

    def put(self, key: str, data: bytes, bucket: str = BUCKET) -> str:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (host, port) that can misbehave.

    mode: "pass" (forward), "slow" (hold each response chunk ``delay`` seconds), "hang" (read requests, never
    answer), "latency" (hold each request ``delay`` seconds before forwarding it: a distant store; with
    ``bandwidth`` bytes/s per connection for responses, None: unlimited). Connections are served by daemon
    threads; ``close()`` stops listening and drops them. ``requests``: (method, path) of every request.
    target_endpoint None: no server behind, a plain socket server that accepts, reads and never answers.
    hang_if: a substring of request paths (any mode): such a request is swallowed, never forwarded, so its
    client waits for an answer that never comes (one object of a store that stops answering).
    benchmarks/latency.py uses it too.
    """

    def __init__(self, target_endpoint: str | None, mode: str = "pass", delay: float = 0.0,
                 bandwidth: float | None = None):
        self.bandwidth = bandwidth
        if target_endpoint is None:
            self.target = None
        else:
            host, port = target_endpoint.rsplit("//", 1)[1].split(":")
            self.target = (host, int(port))
        self.mode, self.delay = mode, delay
        self.hang_if: str | None = None
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.requests: list[tuple[str, str]] = []   # (method, path) of every request forwarded: a counter
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket):
        if self.target is None:  # silent: read whatever comes, answer nothing
            try:
                while c.recv(65536):
                    pass
            except OSError:
                pass
            return
        try:
            up = socket.create_connection(self.target, timeout=30)
        except OSError:
            c.close()
            return
        self.conns.append(up)
        threading.Thread(target=self._pump, args=(c, up, False), daemon=True).start()
        self._pump(up, c, True)

    def _pump(self, src: socket.socket, dst: socket.socket, response: bool):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not response:
                    seen = [(m.decode(), p.decode()) for m, p in _REQUEST_LINE.findall(data)]
                    self.requests.extend(seen)
                    if self.mode == "latency" and seen:
                        time.sleep(self.delay * len(seen))
                    if self.hang_if and any(self.hang_if in path for _, path in seen):
                        continue  # swallowed: this connection's client waits until its own timeout
                elif self.bandwidth:
                    time.sleep(len(data) / self.bandwidth)
                if response and self.mode == "hang":
                    continue  # swallow: the client waits for an answer that never comes
                if response and self.mode == "slow":
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if response and self.mode == "hang":
                return  # the client's connection stays open and silent until close()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.closed = True
        for s in [self.sock] + self.conns:
            try:
                s.close()
            except OSError:
                pass
