#!/usr/bin/env python3
"""How many blocking queries a change wakes, per-service index against the
registry-wide one, measured in one run on one registrar.

    cargo build --release -p waypost-registrar --bin registrar
    python3 scripts/bench-consul-blocking.py target/release/registrar

Starts `registrar serve` (memory backend, loopback ports), registers 200
services with one endpoint each, and runs one blocking watcher per service
on each of two routes:

- `GET /v1/health/service/<name>?index=` (Consul's route: the service's own
  modify index), and
- `GET /v1/services/<name>?index=` (the registry's route: the registry-wide
  version, which is what Consul's route answered before).

Then (1) one service changes once: how many watchers of each route
returned; (2) 10 services change once a second for 5 s: how many
responses each route sent in all (Consul sends about 50). Bounded: every
request has a timeout, and the whole run stops within a few minutes.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SERVICES = 200


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def request(base, method, path, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return int(resp.headers.get("X-Consul-Index", "0")), resp.read()


class Watchers:
    """One blocking watcher per service on `route` (`{name}` in it)."""

    def __init__(self, base, route):
        self.base, self.route = base, route
        self.responses = 0
        self.woken = set()
        self.lock = threading.Lock()
        self.stop = False
        self.threads = [
            threading.Thread(target=self.watch, args=(f"svc-{i}",), daemon=True)
            for i in range(SERVICES)
        ]
        self.ready = threading.Barrier(SERVICES + 1)
        for t in self.threads:
            t.start()
        self.ready.wait(timeout=60)

    def watch(self, name):
        path = self.route.format(name=name)
        index, _ = request(self.base, "GET", path)
        self.ready.wait(timeout=60)
        while not self.stop:
            sep = "&" if "?" in path else "?"
            try:
                index, _ = request(self.base, "GET", f"{path}{sep}index={index}&wait=20s", timeout=30)
            except OSError:
                return
            with self.lock:
                self.responses += 1
                self.woken.add(name)

    def reset(self):
        with self.lock:
            n, woken = self.responses, len(self.woken)
            self.responses, self.woken = 0, set()
        return n, woken


def main():
    binary = sys.argv[1]
    http = free_port()
    base = f"http://127.0.0.1:{http}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [binary, "serve", "--registry-backend=memory",
             f"--grpc-addr=127.0.0.1:{free_port()}", f"--health-addr=127.0.0.1:{free_port()}",
             f"--http-api-addr=127.0.0.1:{http}"],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    request(base, "GET", "/v1/services")
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            port = [1000]

            def change(name):
                port[0] += 1
                request(base, "PUT", f"/v1/services/{name}/a?ack=optimistic",
                        {"address": "127.0.0.1", "port": port[0]})

            for i in range(SERVICES):
                change(f"svc-{i}")
            time.sleep(1)
            routes = {
                "per-service (/v1/health/service)": Watchers(base, "/v1/health/service/{name}"),
                "registry-wide (/v1/services/<name>)": Watchers(base, "/v1/services/{name}"),
            }
            time.sleep(1)
            for w in routes.values():
                w.reset()
            change("svc-0")
            time.sleep(1)
            print(f"one service changed once, {SERVICES} services with one watcher each per route:")
            for name, w in routes.items():
                n, woken = w.reset()
                print(f"  {name:40} {woken:4} of {SERVICES} watchers returned ({n} responses)")
            for _ in range(5):
                for i in range(10):
                    change(f"svc-{i}")
                time.sleep(1)
            time.sleep(1)
            print("10 services changing once a second for 5 s (50 changes):")
            for name, w in routes.items():
                n, woken = w.reset()
                print(f"  {name:40} {n:6} responses ({woken} watchers woken)")
            for w in routes.values():
                w.stop = True
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    os._exit(0)


if __name__ == "__main__":
    main()
