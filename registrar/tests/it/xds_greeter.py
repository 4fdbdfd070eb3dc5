"""A tiny gRPC greeter for the xDS test (tests/xds.rs), with grpcio.

    xds_greeter.py server ID   serve any unary method on 127.0.0.1 (a free
                               port, printed as "port N"), answering every
                               call with ID; runs until stdin closes.
    xds_greeter.py client TARGET
                               call TARGET (e.g. xds:///greeter, with
                               GRPC_XDS_BOOTSTRAP set) in a loop, printing
                               one line per call: "ok ID" or "err CODE".

Messages are raw bytes (no protobuf): the handler is generic.
"""

import concurrent.futures
import sys
import threading
import time

import grpc

METHOD = "/greet.Greeter/Hello"


def serve(ident):
    answer = ident.encode()

    def hello(_request, _context):
        return answer

    handler = grpc.method_handlers_generic_handler(
        "greet.Greeter",
        {"Hello": grpc.unary_unary_rpc_method_handler(hello)},
    )
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"port {port}", flush=True)
    # Serve until the test closes our stdin (or kills us).
    sys.stdin.read()
    server.stop(grace=None)


def client(target):
    channel = grpc.insecure_channel(target)
    call = channel.unary_unary(METHOD)
    done = threading.Event()

    def watch_stdin():
        sys.stdin.read()
        done.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not done.is_set():
        try:
            reply = call(b"hi", timeout=5)
            print(f"ok {reply.decode()}", flush=True)
        except grpc.RpcError as e:
            print(f"err {e.code().name}", flush=True)
            time.sleep(0.05)
        time.sleep(0.005)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("server", "client"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "server":
        serve(sys.argv[2])
    else:
        client(sys.argv[2])


if __name__ == "__main__":
    main()
