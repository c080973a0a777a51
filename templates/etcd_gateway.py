#!/usr/bin/env python3
"""The run's etcd, reached through a client certificate by a program that cannot present one (standard library only).

    etcd_gateway.py --listen 127.0.0.1:PORT --etcd HOST:PORT[,HOST:PORT] --tls-dir DIR [-- COMMAND ARGS...]

TensorRT-LLM's etcd cluster storage connects without TLS and without credentials (Etcd3ClusterStorage: host and
port only, `secure=False`; tensorrt_llm/serve/cluster_storage.py at NVIDIA/TensorRT-LLM@b3809755 and @057d4a79;
docs/trtllm-versions.md "Membership"). The etcd a tk job starts accepts only clients holding a certificate signed
by the run's own certificate authority (etcd --client-cert-auth). This gateway listens on loopback and carries each
connection, byte for byte, into a TLS connection to that etcd presenting the run's client certificate: a worker
(or the proxy) is given `etcd://127.0.0.1:PORT`, and nobody without the run's key can read or write its keys over
the network. gRPC (TensorRT-LLM's client, etcdctl) and HTTP/1.1 (etcd's JSON gateway) both pass: the first bytes a
client sends say which, and the TLS connection offers the matching ALPN protocol (h2 or http/1.1).

DIR holds ca.crt, client.crt and client.key (tk writes them, owner-only, into RUN/secrets/etcd). The etcd's
certificate is checked against ca.crt, not against a host name (the run's CA signs nothing else).

With `-- COMMAND`, the gateway binds its port, forks itself off, and the command replaces this process (its PID
is the server's, as supervision expects); the gateway ends as soon as that process has gone. In a step of several
ranks (a server over several GPUs or nodes), only rank 0 (SLURM_PROCID, PMI_RANK or OMPI_COMM_WORLD_RANK), the
one that serves HTTP and registers, runs a gateway; the others run the command alone.
Exit 2 with the reason when the port cannot be bound or DIR cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import sys

H2_PREFACE = b"PRI * HTTP/2.0"
CONNECT_TIMEOUT_S = 5  # per etcd endpoint
FIRST_BYTES_TIMEOUT_S = 30  # a client that connects and says nothing is dropped
MAX_CONNECTIONS = 256
RANK_ENV = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
CHUNK = 65536


def tls_context(tls_dir: str, alpn: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(os.path.join(tls_dir, "ca.crt"))
    ctx.check_hostname = False  # the run's own CA signs only the run's etcd: the chain is the identity
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(os.path.join(tls_dir, "client.crt"), os.path.join(tls_dir, "client.key"))
    ctx.set_alpn_protocols([alpn])
    return ctx


def parse_endpoints(text: str) -> list[tuple[str, int]]:
    out = []
    for ep in text.split(","):
        host, sep, port = ep.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--etcd {text!r}: expected HOST:PORT[,HOST:PORT]")
        out.append((host.strip("[]"), int(port)))
    return out


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


class Gateway:
    def __init__(self, endpoints: list[tuple[str, int]], tls_dir: str):
        self.endpoints = endpoints
        self.contexts = {alpn: tls_context(tls_dir, alpn) for alpn in ("h2", "http/1.1")}
        self.active = 0

    async def handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if self.active >= MAX_CONNECTIONS:
            c_writer.close()
            return
        self.active += 1
        try:
            try:
                first = await asyncio.wait_for(c_reader.read(CHUNK), FIRST_BYTES_TIMEOUT_S)
            except (asyncio.TimeoutError, OSError):
                return
            if not first:
                return
            alpn = "h2" if first.startswith(H2_PREFACE) else "http/1.1"
            upstream = None
            for host, port in self.endpoints:
                try:
                    upstream = await asyncio.wait_for(
                        asyncio.open_connection(host, port, ssl=self.contexts[alpn], server_hostname=host),
                        CONNECT_TIMEOUT_S)
                    break
                except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
                    print(f"etcd_gateway: {host}:{port}: {exc}", file=sys.stderr, flush=True)
            if upstream is None:
                return
            e_reader, e_writer = upstream
            e_writer.write(first)
            await asyncio.gather(_pipe(c_reader, e_writer), _pipe(e_reader, c_writer))
        finally:
            self.active -= 1
            try:
                c_writer.close()
            except OSError:
                pass


async def serve(sock: socket.socket, gateway: Gateway, parent: int | None) -> None:
    server = await asyncio.start_server(gateway.handle, sock=sock)
    async with server:
        if parent is None:
            await server.serve_forever()
        while os.getppid() == parent:  # the command this gateway serves is still there
            await asyncio.sleep(1)


def main(argv: list[str]) -> int:
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="etcd_gateway.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="127.0.0.1:PORT")
    p.add_argument("--etcd", required=True, help="HOST:PORT[,HOST:PORT]")
    p.add_argument("--tls-dir", required=True)
    args = p.parse_args(argv)
    rank = next((os.environ[v] for v in RANK_ENV if os.environ.get(v)), "0")
    if command and rank != "0":
        return _exec(command)
    try:
        endpoints = parse_endpoints(args.etcd)
        host, _, port = args.listen.rpartition(":")
        gateway = Gateway(endpoints, args.tls_dir)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(128)
    except (OSError, ValueError, ssl.SSLError) as exc:
        print(f"etcd_gateway.py: {exc}", file=sys.stderr)
        return 2
    if not command:
        asyncio.run(serve(sock, gateway, None))
        return 0
    parent = os.getpid()
    if os.fork() == 0:  # the gateway: serves until the command's process has gone
        try:
            asyncio.run(serve(sock, gateway, parent))
        finally:
            os._exit(0)
    sock.close()
    return _exec(command)


def _exec(command: list[str]) -> int:
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"etcd_gateway.py: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
