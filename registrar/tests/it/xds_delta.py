"""A delta xDS client for the resume test (tests/it/xds_resume.rs), with
grpcio and the Envoy API stubs of the xds-protos package.

    xds_delta.py ADDR REQUEST

ADDR is the registrar's xDS address (host:port, plaintext). REQUEST is a
JSON object:

    {"node": "proxy-1",
     "held": {"web": "VERSION", ...},     # initial_resource_versions
     "want": {"web": 1, "db": 2, ...}}    # endpoints expected per name

The client opens one DeltaAggregatedResources stream, subscribes to the
load assignments (EDS) named in "want" while saying it holds "held",
acknowledges every response, and reads until each wanted name was sent
with its expected number of endpoints, or was held and not sent. It then
prints one JSON line, {"versions": {name: version}, "sent": [name, ...]},
and exits 0. Anything else (a NACK-worthy response, the stream ending, no
answer within 30 s) exits non-zero with a message on stderr.
"""

import json
import queue
import sys

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
DEADLINE_S = 30


def endpoint_count(resource):
    cla = endpoint_pb2.ClusterLoadAssignment()
    if not resource.resource.Unpack(cla):
        raise SystemExit(f"resource {resource.name!r} is not a ClusterLoadAssignment")
    return sum(len(locality.lb_endpoints) for locality in cla.endpoints)


def follow(addr, node, held, want):
    requests = queue.Queue()
    requests.put(
        discovery_pb2.DeltaDiscoveryRequest(
            node=base_pb2.Node(id=node, cluster="test"),
            type_url=EDS,
            resource_names_subscribe=sorted(want),
            initial_resource_versions=held,
        )
    )

    def outgoing():
        while True:
            req = requests.get()
            if req is None:
                return
            yield req

    versions = dict(held)
    counts = {}
    sent = []
    with grpc.insecure_channel(addr) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        responses = stub.DeltaAggregatedResources(outgoing(), timeout=DEADLINE_S)
        try:
            for resp in responses:
                if resp.type_url != EDS:
                    raise SystemExit(f"a response of type {resp.type_url!r}")
                for r in resp.resources:
                    sent.append(r.name)
                    versions[r.name] = r.version
                    counts[r.name] = endpoint_count(r)
                requests.put(
                    discovery_pb2.DeltaDiscoveryRequest(
                        type_url=resp.type_url, response_nonce=resp.nonce
                    )
                )
                if all(
                    counts.get(name) == n if name in counts else name in held
                    for name, n in want.items()
                ):
                    return versions, sent
        finally:
            requests.put(None)
            responses.cancel()
    raise SystemExit(f"the stream ended after {sent!r}")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    request = json.loads(sys.argv[2])
    try:
        versions, sent = follow(
            sys.argv[1], request["node"], request.get("held", {}), request["want"]
        )
    except grpc.RpcError as e:
        raise SystemExit(f"xDS stream failed: {e.code().name}: {e.details()}")
    print(json.dumps({"versions": versions, "sent": sent}), flush=True)


if __name__ == "__main__":
    main()
