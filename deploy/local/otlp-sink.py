#!/usr/bin/env python3
"""deploy/local/otlp-sink.py [PORT]: an OTLP/HTTP receiver that accepts and drops everything.

For measuring what exporting spans costs the relay (`relay-bench --traced` with
OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT): every POST is read whole and answered
200 with an empty protobuf message (a valid ExportTraceServiceResponse). On SIGTERM/SIGINT it
prints how many requests and bytes it took.
"""
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

requests = 0
received = 0


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 (the http.server API)
        global requests, received
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        requests += 1
        received += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 4318
    server = ThreadingHTTPServer(("127.0.0.1", port), Sink)

    def stop(*_):
        print(f"otlp-sink: {requests} requests, {received} bytes", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
