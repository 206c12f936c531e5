#!/usr/bin/env python3
"""tls_forward.py: TLS in front of a plaintext TCP server, for the tests.

  tls_forward.py --cert PEM --key PEM --target HOST:PORT [--port P] [--client-ca PEM]

Listens on 127.0.0.1:P (default 0: a port the system picks) with the certificate
--cert and its key --key, and forwards each connection's decrypted bytes to
HOST:PORT, and the answers back. With --client-ca, a client must present a
certificate signed by that CA (mutual TLS) or the handshake fails.

Once listening, it prints the bound port on one line of stdout and nothing else
there: the caller reads the port it really got (a port probed free beforehand can
be taken by another server before this one binds it). Diagnostics go to stderr.
Runs until killed.

Used by the test harness (e2e::secured::TlsForwarder) in front of its OTLP
receiver, for the services' span export over HTTPS with a private CA.
"""

import argparse
import asyncio
import ssl
import sys


async def pipe(reader, writer):
    """Copies reader to writer until EOF or an error, then closes writer."""
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.close()


async def serve(args):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    if args.client_ca:
        context.load_verify_locations(args.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    host, port = args.target.rsplit(":", 1)

    async def handle(client_reader, client_writer):
        try:
            target_reader, target_writer = await asyncio.open_connection(host, int(port))
        except OSError as e:
            print(f"tls_forward: cannot reach {args.target}: {e}", file=sys.stderr, flush=True)
            client_writer.close()
            return
        await asyncio.gather(
            pipe(client_reader, target_writer), pipe(target_reader, client_writer)
        )

    server = await asyncio.start_server(handle, "127.0.0.1", args.port, ssl=context)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--target", required=True, help="HOST:PORT of the plaintext server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--client-ca", help="require client certificates signed by this CA")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
