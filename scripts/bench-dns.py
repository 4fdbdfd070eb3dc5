#!/usr/bin/env python3
"""The registrar's DNS face against Knot DNS serving the same records, on
loopback, measured with dnsperf in one run.

    python3 scripts/bench-dns.py                      # 1,000 and 100,000 endpoints
    python3 scripts/bench-dns.py --endpoints 1000 --seconds 10 --rounds 2
    python3 scripts/bench-dns.py --binary target/release/registrar

Needs: cargo (it builds `registrar` in release unless --binary is given),
and Debian's `knot` and `dnsperf` (`apt-get install knot dnsperf`); the
Python standard library only.

For each size N it starts `registrar serve --registry-backend=memory
--dns-addr=…` and registers N endpoints over the HTTP API (10 per service,
services `svc-<k>`, endpoint `e<i>` on node `node-<i>`, cluster `default`),
writes the same records as a zone file for Knot (SOA serial taken from the
registrar's, plus the NS record and its address that Knot needs) and
starts `knotd` on loopback. It then asks both servers every name of the
zone (A and SRV of each service under `<svc>.<domain>` and
`<svc>.service.<domain>`, A of each node name, A of unknown names, the
apex's SOA) and stops with an error on the first answer that differs
(response code, flags AA and TC, and every section but OPT, compared as
sets). Then it runs dnsperf (`-c 4 -e`, as fast as the servers answer)
against each server in turn, `--rounds` times, on three query mixes:

- `service`: A and SRV of `<svc>.service.<domain>` for every service;
- `node`: A of `<id>.<node>.node.<domain>` (the SRV targets);
- `nxdomain`: A of names that do not exist.

It prints, per size and mix, the throughput and each server's CPU per
1,000 queries (user and system time from /proc/<pid>/stat over the run,
divided by the queries dnsperf saw answered), and `RATIO` lines:
registrar/Knot for both, and at each size the registrar's CPU per node-name
and NXDOMAIN query over its CPU per service query. Everything listens on
127.0.0.1 and stops when the script ends; a run is bounded (each dnsperf
run by --seconds, loading and waiting by timeouts).
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

DOMAIN = "registry."
TTL = 5
PER_SERVICE = 10
HZ = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def ip_of(i):
    return f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}"


def endpoints(n):
    """(service, id, node, ip) of each endpoint."""
    return [(f"svc-{i // PER_SERVICE}", f"e{i}", f"node-{i}", ip_of(i)) for i in range(n)]


# --- a small DNS client: one question, answers read into comparable text ---

TYPES = {"A": 1, "NS": 2, "SOA": 6, "AAAA": 28, "SRV": 33, "OPT": 41}
TYPE_NAMES = {v: k for k, v in TYPES.items()}


def encode_name(name):
    out = b""
    for label in name.rstrip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


def query_bytes(qid, name, qtype):
    header = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 1)
    question = encode_name(name) + struct.pack(">HH", TYPES[qtype], 1)
    opt = b"\0" + struct.pack(">HHIH", TYPES["OPT"], 1232, 0, 0)
    return header + question + opt


def read_name(msg, at):
    labels, end, hops = [], None, 0
    while True:
        n = msg[at]
        if n & 0xC0 == 0xC0:
            if end is None:
                end = at + 2
            at = ((n & 0x3F) << 8) | msg[at + 1]
            hops += 1
            if hops > 64:
                raise ValueError("compression loop")
            continue
        if n == 0:
            return ".".join(labels).lower() + ".", (end if end is not None else at + 1)
        labels.append(msg[at + 1 : at + 1 + n].decode("ascii", "replace"))
        at += 1 + n


def read_record(msg, at):
    name, at = read_name(msg, at)
    rtype, _cls, ttl, rdlen = struct.unpack(">HHIH", msg[at : at + 10])
    rd = at + 10
    kind = TYPE_NAMES.get(rtype, str(rtype))
    if kind == "A":
        data = socket.inet_ntop(socket.AF_INET, msg[rd : rd + 4])
    elif kind == "AAAA":
        data = socket.inet_ntop(socket.AF_INET6, msg[rd : rd + 16])
    elif kind == "SRV":
        prio, weight, port = struct.unpack(">HHH", msg[rd : rd + 6])
        target, _ = read_name(msg, rd + 6)
        data = f"{prio} {weight} {port} {target}"
    elif kind == "SOA":
        mname, p = read_name(msg, rd)
        rname, p = read_name(msg, p)
        data = f"{mname} {rname} " + " ".join(map(str, struct.unpack(">IIIII", msg[p : p + 20])))
    else:
        data = msg[rd : rd + rdlen].hex()
    return f"{name} {ttl} {kind} {data}", kind, rd + rdlen


def parse_answer(msg):
    _id, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", msg[:12])
    at = 12
    for _ in range(qd):
        _, at = read_name(msg, at)
        at += 4
    sections = []
    for count in (an, ns, ar):
        records = []
        for _ in range(count):
            text, kind, at = read_record(msg, at)
            if kind != "OPT":
                records.append(text)
        sections.append(sorted(records))
    return {
        "rcode": flags & 0xF,
        "aa": bool(flags & 0x0400),
        "tc": bool(flags & 0x0200),
        "answer": sections[0],
        "authority": sections[1],
        "additional": sections[2],
    }


class Asker:
    """Questions over UDP to one server, re-asked on a lost datagram."""

    def __init__(self, port):
        self.addr = ("127.0.0.1", port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(1.0)
        self.qid = random.randrange(65536)

    def ask(self, name, qtype):
        for _ in range(5):
            self.qid = (self.qid + 1) & 0xFFFF
            self.sock.sendto(query_bytes(self.qid, name, qtype), self.addr)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                try:
                    data, _ = self.sock.recvfrom(65535)
                except socket.timeout:
                    break
                if struct.unpack(">H", data[:2])[0] == self.qid:
                    return parse_answer(data)
        raise RuntimeError(f"no answer from {self.addr} to {name} {qtype}")


# --- the registrar ---


class Registrar:
    def __init__(self, binary, workdir):
        self.dns = free_port()
        self.http = free_port()
        args = [
            binary,
            "serve",
            "--registry-backend=memory",
            f"--dns-addr=127.0.0.1:{self.dns}",
            f"--dns-domain={DOMAIN}",
            f"--dns-ttl={TTL}s",
            f"--http-api-addr=127.0.0.1:{self.http}",
            f"--grpc-addr=127.0.0.1:{free_port()}",
            f"--health-addr=127.0.0.1:{free_port()}",
            "--suspect-after=30d",
            "--remove-after=30d",
            "--write-batch-ops=1000",
        ]
        self.log = open(os.path.join(workdir, "registrar.log"), "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("registrar exited; see " + self.log.name)
            if "listening" in line:
                break
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def load(self, eps, threads=8):
        """PUT every endpoint over the HTTP API, `threads` connections."""
        chunks = [eps[i::threads] for i in range(threads)]
        errors = []

        def put(chunk):
            conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=30)
            try:
                for svc, eid, node, ip in chunk:
                    body = json.dumps({"address": ip, "port": 8080, "node": node})
                    conn.request("PUT", f"/v1/services/{svc}/{eid}", body=body)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        errors.append(f"PUT {svc}/{eid}: {resp.status}")
                        return
            finally:
                conn.close()

        workers = [threading.Thread(target=put, args=(c,)) for c in chunks]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=1200)
        if errors:
            raise RuntimeError(errors[0])

    def count(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=30)
        conn.request("GET", "/v1/services")
        services = json.loads(conn.getresponse().read())
        conn.close()
        return sum(s["endpoints"] for s in services)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- Knot ---


def zone_file(path, eps, serial):
    with open(path, "w") as f:
        f.write(f"$ORIGIN {DOMAIN}\n$TTL {TTL}\n")
        f.write(f"@ SOA ns hostmaster {serial} 3600 600 86400 {TTL}\n@ NS ns\nns A 127.0.0.1\n")
        for svc, eid, node, ip in eps:
            target = f"{eid}.{node}.node"
            for owner in (svc, f"{svc}.service"):
                f.write(f"{owner} A {ip}\n{owner} SRV 1 1 8080 {target}\n")
            f.write(f"{target} A {ip}\n")


class Knot:
    def __init__(self, workdir, zone):
        self.port = free_port()
        conf = os.path.join(workdir, "knot.conf")
        with open(conf, "w") as f:
            f.write(
                f"server:\n    listen: 127.0.0.1@{self.port}\n    rundir: {workdir}\n"
                f"database:\n    storage: {workdir}\n"
                f"log:\n  - target: stderr\n    any: warning\n"
                f"template:\n  - id: default\n    storage: {workdir}\n    semantic-checks: off\n"
                f"zone:\n  - domain: {DOMAIN}\n    file: {os.path.basename(zone)}\n"
            )
        self.log = open(os.path.join(workdir, "knot.log"), "w")
        self.proc = subprocess.Popen(["knotd", "-c", conf], stdout=self.log, stderr=self.log)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def wait_for_answer(port, name, qtype, what, limit=600):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            a = Asker(port).ask(name, qtype)
            if a["rcode"] == 0 and a["answer"]:
                return a
        except (RuntimeError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} does not answer {name} {qtype}")


# --- comparing and measuring ---


def names_to_compare(eps, unknown):
    services = sorted({e[0] for e in eps})
    out = [(DOMAIN, "SOA")]
    for svc in services:
        for owner in (f"{svc}.{DOMAIN}", f"{svc}.service.{DOMAIN}"):
            out += [(owner, "A"), (owner, "SRV")]
    out += [(f"{eid}.{node}.node.{DOMAIN}", "A") for _, eid, node, _ in eps]
    out += [(name, "A") for name in unknown]
    return out


def compare(registrar_port, knot_port, questions):
    r, k = Asker(registrar_port), Asker(knot_port)
    for name, qtype in questions:
        a, b = r.ask(name, qtype), k.ask(name, qtype)
        if a != b:
            raise SystemExit(
                f"DIFFERENT answers to {name} {qtype}:\n registrar: {a}\n knot:      {b}"
            )
    return len(questions)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are the 14th and 15th fields; [0] here is the 3rd.
    return (int(fields[11]) + int(fields[12])) / HZ


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        kib = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
    return kib / 1024


def dnsperf(port, pid, datafile, seconds):
    before = cpu_seconds(pid)
    out = subprocess.run(
        ["dnsperf", "-s", "127.0.0.1", "-p", str(port), "-d", datafile,
         "-l", str(seconds), "-c", "4", "-e", "-t", "5"],
        capture_output=True, text=True, timeout=seconds + 60,
    ).stdout
    cpu = cpu_seconds(pid) - before
    completed = int(re.search(r"Queries completed:\s+(\d+)", out).group(1))
    qps = float(re.search(r"Queries per second:\s+([\d.]+)", out).group(1))
    lost = int(re.search(r"Queries lost:\s+(\d+)", out).group(1))
    return {"qps": qps, "completed": completed, "lost": lost,
            "cpu_per_1000_ms": cpu * 1000 / max(completed, 1) * 1000}


def run_size(binary, n, seconds, rounds, workdir):
    print(f"== {n} endpoints ({n // PER_SERVICE} services) ==", flush=True)
    eps = endpoints(n)
    reg = Registrar(binary, workdir)
    knot = None
    try:
        t0 = time.monotonic()
        reg.load(eps)
        deadline = time.monotonic() + 300
        while reg.count() < n:
            if time.monotonic() > deadline:
                raise RuntimeError("the registrar did not take every endpoint")
            time.sleep(0.5)
        print(f"loaded {n} endpoints over HTTP in {time.monotonic() - t0:.1f} s", flush=True)
        soa = wait_for_answer(reg.dns, DOMAIN, "SOA", "the registrar")
        serial = int(soa["answer"][0].split()[-5])
        zone = os.path.join(workdir, "registry.zone")
        zone_file(zone, eps, serial)
        knot = Knot(workdir, zone)
        wait_for_answer(knot.port, f"svc-0.service.{DOMAIN}", "A", "knotd")

        unknown = [f"missing-{i}.{DOMAIN}" for i in range(max(n // PER_SERVICE, 100))]
        t0 = time.monotonic()
        compared = compare(reg.dns, knot.port, names_to_compare(eps, unknown))
        print(f"compared {compared} answers: the same ({time.monotonic() - t0:.1f} s)", flush=True)
        print(f"memory (RSS): registrar {rss_mib(reg.proc.pid):.0f} MiB, "
              f"knotd {rss_mib(knot.proc.pid):.0f} MiB", flush=True)

        services = sorted({e[0] for e in eps})
        mixes = {
            "service": [f"{s}.service.{DOMAIN} {t}" for s in services for t in ("A", "SRV")],
            "node": [f"{eid}.{node}.node.{DOMAIN} A" for _, eid, node, _ in eps],
            "nxdomain": [f"{u} A" for u in unknown],
        }
        results = {}
        for mix, lines in mixes.items():
            random.Random(1).shuffle(lines)
            datafile = os.path.join(workdir, f"{mix}.txt")
            with open(datafile, "w") as f:
                f.write("\n".join(lines) + "\n")
            runs = {"registrar": [], "knot": []}
            for _ in range(rounds):
                runs["registrar"].append(dnsperf(reg.dns, reg.proc.pid, datafile, seconds))
                runs["knot"].append(dnsperf(knot.port, knot.proc.pid, datafile, seconds))
            results[mix] = {}
            for server, rs in runs.items():
                completed = sum(r["completed"] for r in rs)
                qps = sum(r["qps"] for r in rs) / len(rs)
                cpu = sum(r["cpu_per_1000_ms"] * r["completed"] for r in rs) / max(completed, 1)
                lost = sum(r["lost"] for r in rs)
                results[mix][server] = (qps, cpu)
                print(f"{n} {mix:8} {server:9} {qps:10.0f} q/s  {cpu:6.2f} ms CPU per 1,000 "
                      f"queries  ({completed} answered, {lost} lost)", flush=True)
            (rq, rc), (kq, kc) = results[mix]["registrar"], results[mix]["knot"]
            print(f"RATIO dns endpoints={n} mix={mix} throughput registrar/knot {rq / kq:.2f}")
            print(f"RATIO dns endpoints={n} mix={mix} cpu_per_1000 registrar/knot {rc / kc:.2f}",
                  flush=True)
        base = results["service"]["registrar"][1]
        for mix in ("node", "nxdomain"):
            print(f"RATIO dns endpoints={n} registrar cpu_per_query {mix}/service "
                  f"{results[mix]['registrar'][1] / base:.2f}", flush=True)
    finally:
        reg.stop()
        if knot:
            knot.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", type=int, action="append",
                   help="registry size (repeatable; default 1000 and 100000)")
    p.add_argument("--seconds", type=int, default=10, help="each dnsperf run (default 10)")
    p.add_argument("--rounds", type=int, default=2, help="runs per server and mix (default 2)")
    p.add_argument("--binary", help="a built registrar (default: build it in release)")
    args = p.parse_args()
    for tool in ("knotd", "dnsperf"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed: apt-get install knot dnsperf")
    binary = args.binary
    if not binary:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        subprocess.run(["cargo", "build", "--release", "-p", "registrar", "--bin", "registrar"],
                       cwd=root, check=True)
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
        binary = os.path.join(target, "release", "registrar")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    print(f"bench-dns {time.strftime('%Y-%m-%d')} binary={binary} cores={os.cpu_count()}",
          flush=True)
    for n in args.endpoints or [1000, 100000]:
        with tempfile.TemporaryDirectory(prefix="bench-dns-") as workdir:
            run_size(binary, n, args.seconds, args.rounds, workdir)


if __name__ == "__main__":
    main()
