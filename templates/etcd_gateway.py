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

Only the gateway's own user gets through. The port is on loopback, but every user of the node reaches loopback
(another job on a shared node, another user under `tk launch --local`), and whoever writes the worker registry
chooses where prompts go. So, before a byte is read or forwarded, each accepted connection's other end is looked
up: the ESTABLISHED socket whose local address is the connection's peer address and whose remote address is the
gateway's, and its owner (uid). A connection is carried only when that owner is the gateway's own uid.

The lookup is exact and costs microseconds: one request to the kernel's socket diagnostics (netlink
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY without NLM_F_DUMP: the kernel looks the 4-tuple up in its hash tables,
inet_diag_find_one_icsk in net/ipv4/inet_diag.c, as `ss` does), so another user's connections, however many, cannot
slow it down or block the event loop. Where the kernel has no socket diagnostics (the self-test at start fails), the
owner is read from the socket tables /proc/net/tcp and /proc/net/tcp6 (`uid` column) instead: a read that grows with
every socket of the node, so it runs off the event loop, and one pass answers every connection waiting when it begins
(TableOwners: a burst of connections costs a pass or two, not one each); a connection waits at most
OWNER_LOOKUP_TIMEOUT_S, and at most MAX_PENDING_LOOKUPS wait. When the owner cannot be established (no such socket
after OWNER_TRIES lookups, a table past PROC_TABLE_MAX_BYTES, too many waiting), the connection is refused too. Every refusal is logged with its
reason (at most REFUSALS_LOGGED_PER_MIN a minute, then a count). Refused connections never count against
MAX_CONNECTIONS, the connections the gateway carries for its user: another user's flood cannot push the run's own
workers out (a connection past that cap is refused and logged as well). Root on the node is not kept out: it can
read DIR itself.

Nothing ends without a word: a connection handler that fails says so (`etcd_gateway: background-failed {JSON}`,
with the task and the cause) and closes that connection; the gateway itself failing, or ending on a signal, says
so and ends the server it serves (SIGTERM), so that the job's supervision restarts both rather than leaving a
server that cannot reach the storage (its registration would lapse).

With `-- COMMAND`, the gateway binds its port, forks itself off, and the command replaces this process (its PID
is the server's, as supervision expects); the gateway ends as soon as that process has gone. In a step of several
ranks (a server over several GPUs or nodes), only rank 0 (SLURM_PROCID, PMI_RANK or OMPI_COMM_WORLD_RANK), the
one that serves HTTP and registers, runs a gateway; the others run the command alone.
Exit 2 with the reason when the port cannot be bound, DIR cannot be read, or neither the socket diagnostics nor
/proc/net/tcp can be read (a gateway that could not tell its user's connections from others' would refuse them all).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import json
import os
import signal
import socket
import ssl
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

H2_PREFACE = b"PRI * HTTP/2.0"
CONNECT_TIMEOUT_S = 5  # per etcd endpoint
FIRST_BYTES_TIMEOUT_S = 30  # a client that connects and says nothing is dropped
MAX_CONNECTIONS = 256  # connections carried for the gateway's own user at once (refused ones never count)
LISTEN_BACKLOG = 1024  # accepted at once while the loop looks owners up (a flood must not fill the queue)
RANK_ENV = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
CHUNK = 65536

# The owner of a connection's other end (Linux). The kernel's socket tables: one line per socket, `sl local_address
# rem_address st ... uid ...`, addresses as hex ADDR:PORT, ADDR as the kernel holds it in memory printed 32 bits at a
# time as native integers (127.0.0.1 is 0100007F on a little-endian node), PORT as a plain hex number.
PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
PROC_TABLE_MAX_BYTES = 64 * 1024 * 1024  # read at most this much of one table per lookup (~400,000 sockets)
PROC_LINE_MAX_BYTES = 4096  # a socket's line is ~150 bytes
TCP_ESTABLISHED = 0x01  # the `st` column (include/net/tcp_states.h); a closed socket's TIME_WAIT row shows uid 0
OWNER_TRIES = 3  # a table read while sockets come and go may miss a row: read it again, then refuse
OWNER_RETRY_S = 0.05
OWNER_LOOKUP_TIMEOUT_S = 2.0  # a connection waits at most this long for its owner from the /proc tables
MAX_PENDING_LOOKUPS = 4096  # connections waiting for the next pass over the /proc tables; one past them is refused
REFUSALS_LOGGED_PER_MIN = 10

# The kernel's socket diagnostics (Linux uapi headers: linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h; the
# layouts as Debian 12's linux-libc-dev 6.1 declares them).
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1  # without NLM_F_DUMP: the exact lookup of one socket
NLMSG_ERROR = 2
NLMSG_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
INET_DIAG_REQ_V2 = struct.Struct("=BBBxI")  # family, protocol, ext, pad, states; then inet_diag_sockid
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
INET_DIAG_MSG_UID = 64  # offset of idiag_uid in inet_diag_msg: 4 bytes, the 48-byte sockid, expires, rqueue, wqueue
INET_DIAG_MSG_LEN = 72

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Address = Tuple[IPAddress, int]
Pair = Tuple[Address, Address]  # (the client's end, the gateway's end) of one accepted connection


class OwnerUnknown(Exception):
    """The owner of a connection's other end could not be established: the connection is refused."""


def canonical_address(host: str, port: int) -> Address:
    """(ip, port) with an IPv4-mapped IPv6 address (::ffff:127.0.0.1, a dual-stack socket's view) as IPv4."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, port


def proc_addresses(address: Address, byteorder: str = sys.byteorder) -> Tuple[str, ...]:
    """How /proc/net/tcp{,6} write `address`: 127.0.0.1:8080 is '0100007F:1F90' (IPv4 table) and
    '0000000000000000FFFF00000100007F:1F90' (IPv6 table, a dual-stack socket) on a little-endian node."""
    ip, port = address
    fmt = "<%dI" if byteorder == "little" else ">%dI"

    def hexed(packed: bytes) -> str:
        words = struct.unpack(fmt % (len(packed) // 4), packed)
        return "".join("%08X" % w for w in words) + ":%04X" % port
    if isinstance(ip, ipaddress.IPv4Address):
        return hexed(ip.packed), hexed(ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed).packed)
    return (hexed(ip.packed),)


def _owners_in_lines(lines: Iterable[str], wanted: Dict[Tuple[str, str], Pair], found: Dict[Pair, int]) -> None:
    """One pass over a socket table's lines: the uid of each wanted (local, remote) ESTABLISHED socket into found."""
    left = len(set(wanted.values())) - len(found)
    for line in lines:
        if left <= 0:
            return
        fields = line.split()
        if len(fields) < 8:
            continue
        pair = wanted.get((fields[1].upper(), fields[2].upper()))
        if pair is None or pair in found:
            continue
        try:
            state, uid = int(fields[3], 16), int(fields[7])
        except ValueError:
            continue
        if state == TCP_ESTABLISHED:
            found[pair] = uid
            left -= 1


def _wanted(pairs: Iterable[Pair], byteorder: str) -> Dict[Tuple[str, str], Pair]:
    return {(local, remote): (client, server) for client, server in pairs
            for local in proc_addresses(client, byteorder) for remote in proc_addresses(server, byteorder)}


def owner_in_table(lines: Iterable[str], client: Address, server: Address,
                   byteorder: str = sys.byteorder) -> Optional[int]:
    """The uid owning the ESTABLISHED socket at `client` connected to `server` (the other end of a connection the
    gateway accepted at `server`) in the lines of /proc/net/tcp or /proc/net/tcp6 (`sl local_address rem_address
    st tx_queue:rx_queue tr:tm->when retrnsmt uid ...`), or None when they hold no such socket."""
    found: Dict[Pair, int] = {}
    _owners_in_lines(lines, _wanted([(client, server)], byteorder), found)
    return found.get((client, server))


def _table_lines(path: str, max_bytes: int) -> Iterator[str]:
    read = 0
    with open(path, "rb") as f:
        while True:
            line = f.readline(PROC_LINE_MAX_BYTES)
            if not line:
                return
            read += len(line)
            if read > max_bytes:
                raise OwnerUnknown(f"{path} is longer than {max_bytes} bytes")
            yield line.decode("ascii", "replace")


def owners_in_tables(pairs: Sequence[Pair], tables: Sequence[str] = PROC_NET_TCP,
                     max_bytes: int = PROC_TABLE_MAX_BYTES, byteorder: str = sys.byteorder
                     ) -> Dict[Pair, Union[int, str]]:
    """The owners of the other ends of the TCP connections `pairs` (client, server; all on this node), from ONE pass
    over the kernel's socket tables: each pair's uid, or why it cannot be told."""
    wanted = _wanted(pairs, byteorder)
    found: Dict[Pair, int] = {}
    searched, unreadable = [], []
    for path in tables:  # a node without IPv6 has no /proc/net/tcp6: the other table may still hold the socket
        try:
            _owners_in_lines(_table_lines(path, max_bytes), wanted, found)
        except OSError as exc:
            unreadable.append(f"cannot read {path}: {exc.strerror or exc}")
            continue
        except OwnerUnknown as exc:  # a table past its bound: none of those not found yet can be told
            return {pair: found.get(pair, str(exc)) for pair in pairs}
        searched.append(path)
        if len(found) == len(set(pairs)):
            break
    out: Dict[Pair, Union[int, str]] = {}
    for client, server in pairs:
        if (client, server) in found:
            out[(client, server)] = found[(client, server)]
        elif not searched:
            out[(client, server)] = "; ".join(unreadable)
        else:
            out[(client, server)] = "; ".join([f"no established socket {_show(client)} -> {_show(server)} in "
                                               f"{', '.join(searched)}", *unreadable])
    return out


def connection_owner(client: Address, server: Address, tables: Sequence[str] = PROC_NET_TCP,
                     max_bytes: int = PROC_TABLE_MAX_BYTES, byteorder: str = sys.byteorder) -> int:
    """The uid owning the other end of the TCP connection `client` -> `server` (both on this node), read from the
    kernel's socket tables; OwnerUnknown says why it cannot be told."""
    owner = owners_in_tables([(client, server)], tables, max_bytes, byteorder)[(client, server)]
    if isinstance(owner, str):
        raise OwnerUnknown(owner)
    return owner


def sockid(local: Address, remote: Address) -> bytes:
    """struct inet_diag_sockid of the socket at `local` connected to `remote`: ports and addresses in network order,
    addresses in 16 bytes (an IPv4 address in the first 4), no interface, no cookie."""
    def padded(ip: IPAddress) -> bytes:
        return ip.packed + b"\0" * (16 - len(ip.packed))
    return (struct.pack("!HH", local[1], remote[1]) + padded(local[0]) + padded(remote[0])
            + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE))


def diag_request(client: Address, server: Address, seq: int) -> bytes:
    """One SOCK_DIAG_BY_FAMILY request for the TCP socket at `client` connected to `server` (both the same IP
    version: a dual-stack socket's IPv4-mapped view is canonical_address's IPv4)."""
    family = socket.AF_INET if client[0].version == 4 else socket.AF_INET6
    body = INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 1 << TCP_ESTABLISHED) + sockid(client, server)
    return NLMSG_HEADER.pack(NLMSG_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0) + body


def diag_owner(reply: bytes, seq: int) -> Optional[int]:
    """The uid in a reply to request `seq`: None when the reply is another request's (read on); OwnerUnknown when
    the kernel found no such socket, or one that is not ESTABLISHED (a TIME_WAIT or a listener shows uid 0)."""
    if len(reply) < NLMSG_HEADER.size:
        raise OwnerUnknown("the socket diagnostics answered a short message")
    _, kind, _, got, _ = NLMSG_HEADER.unpack_from(reply)
    if got != seq:
        return None
    if kind == NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", reply, NLMSG_HEADER.size)
        if -code == errno.ENOENT:
            raise OwnerUnknown("the kernel has no such established socket")
        raise OwnerUnknown(f"the socket diagnostics answered {os.strerror(-code) if code < 0 else code}")
    if kind != SOCK_DIAG_BY_FAMILY or len(reply) < NLMSG_HEADER.size + INET_DIAG_MSG_LEN:
        raise OwnerUnknown(f"the socket diagnostics answered message type {kind}")
    state = reply[NLMSG_HEADER.size + 1]
    if state != TCP_ESTABLISHED:
        raise OwnerUnknown(f"the socket is in TCP state {state}, not established")
    (uid,) = struct.unpack_from("=I", reply, NLMSG_HEADER.size + INET_DIAG_MSG_UID)
    return int(uid)


class DiagOwners:
    """The exact owner lookup: one netlink request per connection, answered synchronously by the kernel (the
    reply is in the socket's queue when send() returns), read without blocking."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        self.seq = 0

    def __call__(self, client: Address, server: Address) -> int:
        self.seq = self.seq % 0x7FFFFFFF + 1
        try:
            self.sock.send(diag_request(client, server, self.seq))
            while True:  # a reply to an earlier request that was given up on is read and dropped
                owner = diag_owner(self.sock.recv(65536, socket.MSG_DONTWAIT), self.seq)
                if owner is not None:
                    return owner
        except (BlockingIOError, InterruptedError):
            raise OwnerUnknown("the socket diagnostics did not answer") from None
        except OSError as exc:
            raise OwnerUnknown(f"the socket diagnostics failed: {exc.strerror or exc}") from None

    def close(self) -> None:
        self.sock.close()


def exact_owners(listener: socket.socket) -> Tuple[Optional[DiagOwners], str]:
    """The socket diagnostics, if they work here: a connection to the gateway's own listening socket must be found
    as this process's own. (None, why) when they do not."""
    owners: Optional[DiagOwners] = None
    ends: List[socket.socket] = []
    try:
        owners = DiagOwners()
        client = socket.create_connection(listener.getsockname()[:2], timeout=2)
        ends.append(client)
        ends.append(listener.accept()[0])  # closed after the lookup: the client's end is ESTABLISHED until then
        local, remote = client.getsockname(), client.getpeername()
        uid = owners(canonical_address(local[0], local[1]), canonical_address(remote[0], remote[1]))
        if uid != os.getuid():
            raise OwnerUnknown(f"its own connection shows uid {uid}, not {os.getuid()}")
        return owners, ""
    except (OSError, OwnerUnknown, ValueError) as exc:
        if owners is not None:
            owners.close()
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        for end in ends:
            end.close()


def report(task: str, exc: BaseException, then: str) -> None:
    """A failed piece of the gateway's work, as one line: the event name, then JSON (the server's log)."""
    doc = {"task": task, "component": "etcd-gateway", "cause": f"{type(exc).__name__}: {exc}"[:500], "then": then}
    print(f"etcd_gateway: background-failed {json.dumps(doc)}", file=sys.stderr, flush=True)


def _show(address: Address) -> str:
    ip, port = address
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def refusal(owner: int, expected_uid: int) -> Optional[str]:
    """None when a connection whose other end `owner` holds may pass; else why not."""
    if owner == expected_uid:
        return None
    return f"its socket belongs to uid {owner}, not to this gateway's uid {expected_uid}"


def tls_context(tls_dir: str, alpn: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(os.path.join(tls_dir, "ca.crt"))
    ctx.check_hostname = False  # the run's own CA signs only the run's etcd: the chain is the identity
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(os.path.join(tls_dir, "client.crt"), os.path.join(tls_dir, "client.key"))
    ctx.set_alpn_protocols([alpn])
    return ctx


def parse_endpoints(text: str) -> List[Tuple[str, int]]:
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


def spawn(coro: Any, task: str) -> "asyncio.Future[Any]":
    """The gateway's one way to start a task: whatever ends it with an exception is its structured line."""
    started = asyncio.ensure_future(coro)

    def done(t: "asyncio.Future[Any]") -> None:
        if not t.cancelled() and t.exception() is not None:
            report(task, t.exception(), "the connections it served are refused; the next one starts it again")
    started.add_done_callback(done)
    return started


def _one_by_one(owner_of: Callable[[Address, Address], int]) -> Callable[[Sequence[Pair]], Dict[Pair, Union[int, str]]]:
    """A lookup of one connection, as a batch lookup."""
    def read(pairs: Sequence[Pair]) -> Dict[Pair, Union[int, str]]:
        out: Dict[Pair, Union[int, str]] = {}
        for client, server in pairs:
            try:
                out[(client, server)] = owner_of(client, server)
            except OwnerUnknown as exc:
                out[(client, server)] = str(exc)
        return out
    return read


class TableOwners:
    """Owners read from the /proc socket tables, off the event loop: every connection waiting when a pass begins is
    answered by that one pass (a read that grows with every socket of the node costs one pass per batch, not one
    per connection, so another user's burst of connections costs a pass or two, not hundreds)."""

    def __init__(self, read: Callable[[Sequence[Pair]], Dict[Pair, Union[int, str]]] = owners_in_tables):
        self.read = read
        self.waiting: Dict[Pair, List["asyncio.Future[Tuple[Optional[int], str]]"]] = {}
        self.reader: Optional["asyncio.Future[Any]"] = None
        self.pool: Optional[ThreadPoolExecutor] = None

    async def owner(self, client: Address, server: Address) -> int:
        if len(self.waiting) >= MAX_PENDING_LOOKUPS:
            raise OwnerUnknown(f"{MAX_PENDING_LOOKUPS} connections are waiting for their owner already")
        loop = asyncio.get_running_loop()
        answer: "asyncio.Future[Tuple[Optional[int], str]]" = loop.create_future()
        self.waiting.setdefault((client, server), []).append(answer)
        if self.reader is None or self.reader.done():
            self.reader = spawn(self._passes(), "owner-lookup")
        try:
            uid, why = await asyncio.wait_for(asyncio.shield(answer), OWNER_LOOKUP_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise OwnerUnknown(f"the socket tables were not read within {OWNER_LOOKUP_TIMEOUT_S:g}s") from None
        if uid is None:
            raise OwnerUnknown(why)
        return uid

    async def _passes(self) -> None:
        """Pass after pass over the tables while connections wait; each pass answers all that waited before it."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="owner-lookup")
        loop = asyncio.get_running_loop()
        while self.waiting:
            batch, self.waiting = self.waiting, {}
            owners: Dict[Pair, Union[int, str]] = {}
            try:
                owners = await loop.run_in_executor(self.pool, self.read, list(batch))
            finally:  # every connection of the batch is answered, even when the pass failed (spawn says why)
                for pair, answers in batch.items():
                    owner = owners.get(pair, "the lookup of its owner failed")
                    for a in answers:
                        if not a.done():
                            a.set_result((owner, "") if isinstance(owner, int) else (None, str(owner)))


class Gateway:
    """owner_of(client, server) -> uid, raising OwnerUnknown. exact: it is the socket diagnostics' lookup
    (microseconds, on the event loop); else a lookup of the /proc tables (TableOwners: batched, off the loop)."""

    def __init__(self, endpoints: List[Tuple[str, int]], tls_dir: str, uid: Optional[int] = None,
                 owner_of: Optional[Callable[[Address, Address], int]] = None, exact: bool = False):
        self.endpoints = endpoints
        self.contexts = {alpn: tls_context(tls_dir, alpn) for alpn in ("h2", "http/1.1")}
        self.active = 0  # connections carried for the gateway's user (refused ones never count)
        self.uid = os.getuid() if uid is None else uid  # whose connections pass
        self.owner_of = owner_of
        self.exact = exact and owner_of is not None
        self.tables = TableOwners(owners_in_tables if owner_of is None else _one_by_one(owner_of))
        self._log_window = (0.0, 0, 0)  # (start, logged, suppressed) of the current minute

    async def owner(self, client: Address, server: Address) -> int:
        if self.exact:
            assert self.owner_of is not None
            return self.owner_of(client, server)
        return await self.tables.owner(client, server)

    async def admit(self, c_writer: asyncio.StreamWriter) -> bool:
        """Whether this connection's other end belongs to the gateway's own user (logged when not)."""
        peer, ours = c_writer.get_extra_info("peername"), c_writer.get_extra_info("sockname")
        try:
            client, server = canonical_address(peer[0], peer[1]), canonical_address(ours[0], ours[1])
        except (TypeError, ValueError, IndexError):
            self._log_refusal(str(peer), "not a TCP connection over IP")
            return False
        why = "not looked up"
        for attempt in range(OWNER_TRIES):
            if attempt:
                await asyncio.sleep(OWNER_RETRY_S)
            try:
                owner = await self.owner(client, server)
            except OwnerUnknown as exc:
                why = f"its owner cannot be established: {exc}"
                continue
            reason = refusal(owner, self.uid)
            if reason is None:
                return True
            why = reason
            break
        self._log_refusal(_show(client), why)
        return False

    def _log_refusal(self, peer: str, why: str) -> None:
        now = time.monotonic()
        start, logged, suppressed = self._log_window
        if now - start >= 60:
            if suppressed:
                print(f"etcd_gateway: {suppressed} more connections refused in the last minute", file=sys.stderr,
                      flush=True)
            start, logged, suppressed = now, 0, 0
        if logged < REFUSALS_LOGGED_PER_MIN:
            print(f"etcd_gateway: refused a connection from {peer}: {why}", file=sys.stderr, flush=True)
            logged += 1
        else:
            suppressed += 1
        self._log_window = (start, logged, suppressed)

    async def handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            if not await self.admit(c_writer):
                return
            if self.active >= MAX_CONNECTIONS:
                self._log_refusal(str(c_writer.get_extra_info("peername")),
                                  f"the gateway carries {MAX_CONNECTIONS} connections of its user already")
                return
            self.active += 1
            try:
                await self.carry(c_reader, c_writer)
            finally:
                self.active -= 1
        except Exception as exc:  # noqa: BLE001  (said; this connection ends, the gateway goes on)
            report("connection", exc, "the connection is closed")
        finally:
            try:
                c_writer.close()
            except OSError:
                pass

    async def carry(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        """Byte for byte into a TLS connection to the run's etcd (ALPN from the first bytes)."""
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


def _loop_exception(loop: asyncio.AbstractEventLoop, context: Dict[str, Any]) -> None:
    """Whatever asyncio itself would print about a failed callback or task, as the gateway's structured line."""
    exc = context.get("exception")
    if isinstance(exc, asyncio.CancelledError):  # a task cancelled as the loop ends (a signal): not a failure
        return
    report("event-loop", exc if isinstance(exc, BaseException) else RuntimeError(str(context.get("message"))),
           "the gateway goes on")


async def serve(sock: socket.socket, gateway: Gateway, parent: Optional[int]) -> None:
    asyncio.get_running_loop().set_exception_handler(_loop_exception)
    server = await asyncio.start_server(gateway.handle, sock=sock, backlog=LISTEN_BACKLOG)
    async with server:
        if parent is None:
            await server.serve_forever()
        while os.getppid() == parent:  # the command this gateway serves is still there
            await asyncio.sleep(1)


# Signals that end the gateway: said, and its server is ended with it (supervision restarts both). Every signal whose
# default action ends a process (signal(7): "Term" and "Core"), as the job's orchestrator handles them
# (orchestrator/job.py ENDING_SIGNALS), SIGUSR2 too: one left out ended the gateway without a word and left its
# server out of the routing until supervision saw it unregistered. The real-time signals SIGRTMIN..SIGRTMAX (Linux
# numbers its standard signals 1..31; Python before 3.11 names no real-time one) and any valid standard signal this
# Python has no name for (SIGSTKFLT before 3.11) included.
_REALTIME_SIGNALS = frozenset(int(s) for s in signal.valid_signals() if int(s) >= 32)
ENDING_SIGNALS = tuple(sorted(
    {int(getattr(signal, n)) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                                       "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT", "SIGXCPU", "SIGTRAP",
                                       "SIGSYS", "SIGABRT") if hasattr(signal, n)}
    | _REALTIME_SIGNALS
    | {int(s) for s in signal.valid_signals() if int(s) < 32} - {int(s) for s in signal.Signals}))


def signal_name(signum: int) -> str:
    """SIGUSR1, SIGRTMIN+3 for a real-time signal, or "signal 16" for one this Python does not name."""
    if signum in _REALTIME_SIGNALS:
        return f"SIGRTMIN+{signum - min(_REALTIME_SIGNALS)}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Ended(Exception):
    """The gateway was signalled."""


def run_beside(sock: socket.socket, gateway: Gateway, parent: int,
               end_server: Callable[[int, int], None] = os.kill) -> int:
    """The gateway of the server `parent`: serve until that process has gone (exit 0). When the gateway fails, or is
    signalled, while its server runs: say so and end the server too (SIGTERM; a step's teardown signals both
    anyway), exit 1."""
    def on_signal(signum: int, _frame: Any) -> None:
        raise Ended(signal_name(signum))
    for sig in ENDING_SIGNALS:
        signal.signal(sig, on_signal)
    try:
        asyncio.run(serve(sock, gateway, parent))
        return 0
    except Ended as exc:
        alive = os.getppid() == parent
        print(f"etcd_gateway: ended by {exc}" + (f"; its server (pid {parent}) is ended too" if alive else ""),
              file=sys.stderr, flush=True)
    except BaseException as exc:  # noqa: BLE001  (said; its server cannot reach the storage without it)
        alive = os.getppid() == parent
        report("gateway", exc, f"its server (pid {parent}) is ended so that supervision restarts both" if alive
               else "its server has gone")
    if os.getppid() == parent:
        try:
            end_server(parent, signal.SIGTERM)
        except OSError as inner:
            report("gateway", inner, f"its server (pid {parent}) could not be ended")
    return 1


def main(argv: List[str]) -> int:
    command: List[str] = []
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
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(LISTEN_BACKLOG)
        exact, why = exact_owners(sock)
        if exact is not None:
            gateway = Gateway(endpoints, args.tls_dir, owner_of=exact, exact=True)
        else:
            with open(PROC_NET_TCP[0], "rb") as table:  # the lookup's source: without it every connection is refused
                table.readline(PROC_LINE_MAX_BYTES)
            print(f"etcd_gateway: the kernel's socket diagnostics do not answer here ({why}); connection owners are "
                  "read from /proc/net/tcp off the event loop, bounded", file=sys.stderr, flush=True)
            gateway = Gateway(endpoints, args.tls_dir)  # the /proc tables, read off the loop
    except (OSError, ValueError, ssl.SSLError) as exc:
        print(f"etcd_gateway.py: {exc}", file=sys.stderr)
        return 2
    if not command:
        asyncio.run(serve(sock, gateway, None))
        return 0
    parent = os.getpid()
    if os.fork() == 0:  # the gateway: serves until the command's process has gone
        code = 1
        try:
            code = run_beside(sock, gateway, parent)
        finally:
            os._exit(code)
    sock.close()
    return _exec(command)


def _exec(command: List[str]) -> int:
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"etcd_gateway.py: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
