"""py-consul against the registrar's HTTP API (its port is the argument),
as a Python service and its operators use Consul's agent: register with a
TTL check, report it, watch it expire with a blocking health query, an
HTTP check against a small server that starts failing, bad registrations,
re-registration in place, deregistration. Prints `py-consul: ok` when
every step held; any failed step raises. Talks to 127.0.0.1 only."""

import http.server
import sys
import threading
import time

import consul

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


def status(check_id):
    return c.agent.checks().get(check_id, {}).get("Status")


assert c.status.leader(), "status.leader() is empty"

# A TTL check: critical until reported, passing after a pass.
assert c.agent.service.register(
    "web", service_id="web-1", address="127.0.0.1", port=8080, tags=["v1"],
    meta={"zone": "z1"}, check=consul.Check.ttl("2s"))
until("the TTL check, critical", lambda: status("service:web-1") == "critical")
index, nodes = c.health.service("web", passing=True)
assert nodes == [], nodes
c.agent.check.ttl_pass("service:web-1", notes="ready")
index, nodes = until("web-1 passing", lambda: (lambda r: r if r[1] else None)(
    c.health.service("web", passing=True)))
assert [n["Service"]["ID"] for n in nodes] == ["web-1"], nodes
assert nodes[0]["Service"]["Tags"] == ["v1"], nodes
assert nodes[0]["Checks"][0]["Output"] == "ready", nodes

# No pass for 2 s: a blocking query returns with the check critical.
while True:
    index, nodes = c.health.service("web", index=index, wait="30s")
    if nodes and nodes[0]["Checks"][0]["Status"] == "critical":
        break
    assert time.monotonic() < DEADLINE, "the TTL check never expired"
index, nodes = c.health.service("web", passing=True)
assert nodes == [], nodes
c.agent.check.ttl_pass("service:web-1")
until("web-1 passing again", lambda: c.health.service("web", passing=True)[1])

services = c.agent.services()
assert services["web-1"]["Service"] == "web", services
assert services["web-1"]["Meta"] == {"zone": "z1", "tags": "v1"}, services
index, catalog = c.catalog.service("web")
assert [s["ServiceID"] for s in catalog] == ["web-1"], catalog

# Registering the same ID again updates it in place.
assert c.agent.service.register(
    "web", service_id="web-1", address="127.0.0.1", port=9090, tags=["v2"],
    check=consul.Check.ttl("2s"))
until("web-1 on 9090", lambda: c.agent.service_definition("web-1")["Port"] == 9090)
assert len(c.health.service("web")[1]) == 1

# A bad registration is refused (400, naming the field) and stores nothing.
try:
    c.agent.service.register("web", service_id="web-1", port=1, meta={"tags": "x"},
                             address="127.0.0.1")
except consul.ConsulException as e:
    assert "400" in str(e) and "Meta" in str(e), e
else:
    raise AssertionError("a Meta key `tags` was accepted")
assert c.agent.service_definition("web-1")["Port"] == 9090


# An HTTP check the registrar runs, against a server that starts failing.
class Health(http.server.BaseHTTPRequestHandler):
    failing = False

    def do_GET(self):
        self.send_response(500 if Health.failing else 200)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/health"
assert c.agent.service.register(
    "api", service_id="api-1", address="127.0.0.1", port=server.server_address[1],
    check=consul.Check.http(url, "1s", timeout="1s"))
until("the HTTP check, passing", lambda: status("service:api-1") == "passing")
Health.failing = True
until("the HTTP check, critical", lambda: status("service:api-1") == "critical")
index, nodes = c.health.service("api", passing=True)
assert nodes == [], nodes
Health.failing = False
until("the HTTP check, passing again", lambda: status("service:api-1") == "passing")

# Deregistered: gone from the agent and from health.
assert c.agent.service.deregister("web-1")
assert c.agent.service.deregister("api-1")
until("both gone", lambda: not c.agent.services())
assert c.health.service("web")[1] == []
server.shutdown()
print("py-consul: ok")
