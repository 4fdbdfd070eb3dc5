"""py-consul against the registrar's HTTP API (its port is the argument),
as a field tool reads Consul: weights registered and read back, checks by
state, the nodes and one node, a filtered health query, a query parameter
the registrar does not implement, a boolean as Go reads it, and an HTTP
check with FailuresBeforeCritical=3 against a small server whose answers
the script plans. Prints `py-consul reads: ok` when every step held; any
failed step raises. Talks to 127.0.0.1 only."""

import collections
import http.server
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import consul
import consul.exceptions
from consul.callback import CB

port = int(sys.argv[1])
c = consul.Consul(host="127.0.0.1", port=port)
DEADLINE = time.monotonic() + 90


def until(what, fn):
    """Call fn until it returns a true value; fail after the deadline."""
    while time.monotonic() < DEADLINE:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# Weights: Passing kept, shown in every answer.
assert c.agent.service.register(
    "web", service_id="web-1", address="127.0.0.1", port=8080, tags=["v1"],
    meta={"zone": "z1"}, weights={"Passing": 7, "Warning": 1},
    check=consul.Check.ttl("10m"))
assert c.agent.service.register(
    "web", service_id="web-2", address="127.0.0.2", port=8080, tags=["v1"],
    meta={"zone": "z2"}, check=consul.Check.ttl("10m"))
c.agent.check.ttl_pass("service:web-1")
until("web-1 passing", lambda: c.health.service("web", passing=True)[1])
assert c.agent.services()["web-1"]["Weights"] == {"Passing": 7, "Warning": 1}
index, catalog = c.catalog.service("web")
by_id = {s["ServiceID"]: s for s in catalog}
assert by_id["web-1"]["ServiceWeights"]["Passing"] == 7, catalog
assert by_id["web-2"]["ServiceWeights"]["Passing"] == 1, catalog

# Checks by state: web-2's TTL check was never reported.
index, critical = c.health.state("critical")
assert [ch["ServiceID"] for ch in critical] == ["web-2"], critical
index, passing = c.health.state("passing")
assert [ch["ServiceID"] for ch in passing] == ["web-1"], passing
index, anything = c.health.state("any")
assert len(anything) == 2, anything

# The nodes (without a node of their own, endpoints show their service).
index, nodes = c.catalog.nodes()
assert [n["Node"] for n in nodes] == ["web"], nodes
index, node = c.catalog.node("web")
assert sorted(node["Services"]) == ["web-1", "web-2"], node
assert node["Services"]["web-1"]["Weights"]["Passing"] == 7, node
index, missing = c.catalog.node("nope")
assert missing is None, missing
assert c.catalog.datacenters() == ["test"]

# ?filter= through health.service and catalog.service.
index, filtered = c.health.service("web", filter_expr='Service.Meta.zone == "z2"')
assert [e["Service"]["ID"] for e in filtered] == ["web-2"], filtered
index, filtered = c.health.service("web", filter_expr='Checks.Status == "critical"')
assert [e["Service"]["ID"] for e in filtered] == ["web-2"], filtered
index, filtered = c.catalog.service("web", filter_expr='ServiceMeta["zone"] == "z1"')
assert [e["ServiceID"] for e in filtered] == ["web-1"], filtered
try:
    c.health.service("web", filter_expr='Service.ID matches "w.*"')
except consul.exceptions.BadRequest as e:
    assert "matches" in str(e), e
else:
    raise AssertionError("a filter with `matches` was accepted")

# A parameter the registrar does not implement is refused, by name.
try:
    c.http.get(CB.json(index=True), "/v1/health/service/web", params=[("near", "_agent")])
except consul.exceptions.BadRequest as e:
    assert '"near"' in str(e), e
else:
    raise AssertionError("?near was accepted")

# Booleans as Go's ParseBool reads them (py-consul sends `True` where a
# Python bool meets a query string).
url = f"http://127.0.0.1:{port}/v1/health/service/web?passing=True"
with urllib.request.urlopen(url) as resp:
    assert [e["Service"]["ID"] for e in json.load(resp)] == ["web-1"]


# An HTTP check with FailuresBeforeCritical=3. The server answers each
# request only once the script releases it, with the planned status: while
# request n + 1 waits, the registrar has recorded request n's result.
class Gated(http.server.BaseHTTPRequestHandler):
    plan = collections.deque()
    gate = threading.Semaphore(0)
    arrived = 0
    cond = threading.Condition()

    def do_GET(self):
        with Gated.cond:
            Gated.arrived += 1
            Gated.cond.notify_all()
        Gated.gate.acquire()
        code = Gated.plan.popleft() if Gated.plan else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def arrivals(n):
    with Gated.cond:
        assert Gated.cond.wait_for(lambda: Gated.arrived >= n, timeout=30), \
            f"the registrar did not run the check a {n}th time"


def answer(code):
    with Gated.cond:
        following = Gated.arrived + 1
    Gated.plan.append(code)
    Gated.gate.release()
    arrivals(following)


def status(check_id):
    return c.agent.checks().get(check_id, {}).get("Status")


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gated)
threading.Thread(target=server.serve_forever, daemon=True).start()
health_url = f"http://127.0.0.1:{server.server_address[1]}/health"
check = consul.Check.http(health_url, "1s", timeout="1m")
check["FailuresBeforeCritical"] = 3
check["Status"] = "passing"
assert c.agent.service.register(
    "api", service_id="api-1", address="127.0.0.1", port=server.server_address[1],
    check=check)
arrivals(1)
answer(500)
assert status("service:api-1") == "passing"
answer(200)
answer(500)
answer(500)
assert status("service:api-1") == "passing"
answer(500)
until("the HTTP check, critical after three failures in a row",
      lambda: status("service:api-1") == "critical")
index, critical = c.health.state("critical", filter_expr='ServiceName == "api"')
assert [ch["CheckID"] for ch in critical] == ["service:api-1"], critical

for _ in range(100):
    Gated.gate.release()
assert c.agent.service.deregister("web-1")
assert c.agent.service.deregister("web-2")
assert c.agent.service.deregister("api-1")
until("all gone", lambda: not c.agent.services())
server.shutdown()
print("py-consul reads: ok")
