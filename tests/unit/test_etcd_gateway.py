"""Spec: the etcd gateway (templates/etcd_gateway.py) carries a connection only for its own user.

Its port is on loopback, which every user of the node reaches; the run's certificate it presents writes the worker
registry. So each accepted connection's other end is looked up in the kernel's socket tables (/proc/net/tcp and
/proc/net/tcp6, read here from fixture text shaped as Linux writes them), and the connection passes only when that
socket's owner is the gateway's uid. An owner that cannot be established refuses the connection (fail closed),
and every refusal is logged with its reason, at a bounded rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_gateway():
    spec = importlib.util.spec_from_file_location("etcd_gateway", ROOT / "templates" / "etcd_gateway.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gw = _load_gateway()

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
HEADER6 = ("  sl  local_address                         remote_address                        st tx_queue rx_queue "
           "tr tm->when retrnsmt   uid  timeout inode\n")


def row(sl: int, local: str, remote: str, state: str, uid: int, inode: int) -> str:
    return (f"{sl:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:5d}        0 {inode} 1 "
            "0000000000000000 20 4 30 10 -1\n")


def addr(host: str, port: int):
    return gw.canonical_address(host, port)


# A gateway (uid 1000) listening on 127.0.0.1:2381 (0x094D) has accepted a connection from 127.0.0.1:51000
# (0xC738), whose socket belongs to uid 1001. Little-endian hex, as an x86 or Arm node writes it.
GATEWAY_AT, CLIENT_AT = addr("127.0.0.1", 2381), addr("127.0.0.1", 51000)
TCP = (HEADER
       + row(0, "0100007F:094D", "00000000:0000", "0A", 1000, 4001)  # the gateway's listening socket
       + row(1, "0100007F:094D", "0100007F:C738", "01", 1000, 4002)  # its end of the connection
       + row(2, "0100007F:C738", "0100007F:094D", "01", 1001, 4003)  # the other end: the client's socket
       + row(3, "0100007F:C739", "0100007F:094D", "06", 0, 0))       # an earlier client's TIME_WAIT (uid 0)


@contextlib.contextmanager
def _handlers_restored(signals):
    """The handlers of ``signals`` put back as they were, whatever the gateway under test installed."""
    import signal

    saved = {s: signal.getsignal(s) for s in signals}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_addresses_are_written_as_the_kernel_writes_them():
    assert gw.proc_addresses(addr("127.0.0.1", 8080), "little") == (
        "0100007F:1F90", "0000000000000000FFFF00000100007F:1F90")  # IPv4 table, and a dual-stack socket's row
    assert gw.proc_addresses(addr("127.0.0.1", 8080), "big")[0] == "7F000001:1F90"
    assert gw.proc_addresses(addr("::1", 8080), "little") == ("00000000000000000000000001000000:1F90",)
    assert gw.proc_addresses(addr("::1", 8080), "big") == ("00000000000000000000000000000001:1F90",)
    # a dual-stack listener sees ::ffff:127.0.0.1; it is the same address as the IPv4 socket's
    assert addr("::ffff:127.0.0.1", 1) == (ipaddress.IPv4Address("127.0.0.1"), 1)


def test_the_owner_is_the_uid_of_the_socket_at_the_other_end_not_the_gateways_own_end():
    assert gw.owner_in_table(TCP.splitlines(), CLIENT_AT, GATEWAY_AT, "little") == 1001


def test_only_an_established_socket_counts_a_closed_ones_time_wait_row_shows_uid_0():
    assert gw.owner_in_table(TCP.splitlines(), addr("127.0.0.1", 0xC739), GATEWAY_AT, "little") is None
    assert gw.owner_in_table(TCP.splitlines(), addr("127.0.0.1", 40000), GATEWAY_AT, "little") is None


def test_ipv6_loopback_and_ipv4_mapped_rows_are_found_in_the_ipv6_table():
    tcp6 = (HEADER6
            + row(0, "00000000000000000000000001000000:094D", "00000000000000000000000001000000:C738", "01", 1000, 1)
            + row(1, "00000000000000000000000001000000:C738", "00000000000000000000000001000000:094D", "01", 1002, 2)
            # a dual-stack client socket connected to the IPv4 gateway
            + row(2, "0000000000000000FFFF00000100007F:C73A", "0000000000000000FFFF00000100007F:094D", "01", 1003, 3))
    lines = tcp6.splitlines()
    assert gw.owner_in_table(lines, addr("::1", 51000), addr("::1", 2381), "little") == 1002
    assert gw.owner_in_table(lines, addr("127.0.0.1", 51002), GATEWAY_AT, "little") == 1003
    assert gw.owner_in_table(lines, addr("::ffff:127.0.0.1", 51002), addr("::ffff:127.0.0.1", 2381), "little") == 1003


def test_lines_that_are_not_a_sockets_are_skipped():
    garbage = ["", "  0: zz:zz 0100007F:094D 01 x x x x 1001", "  1: 0100007F:C738 0100007F:094D 01 a b c d notauid",
               "0100007F:C738 0100007F:094D 01"]
    assert gw.owner_in_table(garbage + TCP.splitlines(), CLIENT_AT, GATEWAY_AT, "little") == 1001


def test_the_tables_are_read_in_turn_and_an_owner_that_cannot_be_found_says_why(tmp_path):
    tcp, tcp6 = tmp_path / "tcp", tmp_path / "tcp6"
    tcp.write_text(HEADER)
    tcp6.write_text(HEADER6 + row(0, "0000000000000000FFFF00000100007F:C738", "0000000000000000FFFF00000100007F:094D",
                                  "01", 1001, 1))
    assert gw.connection_owner(CLIENT_AT, GATEWAY_AT, (str(tcp), str(tcp6)), byteorder="little") == 1001
    tcp6.unlink()  # a node without IPv6 has no tcp6 table
    with pytest.raises(gw.OwnerUnknown, match=r"no established socket 127.0.0.1:51000 -> 127.0.0.1:2381 in .*/tcp; "
                                              r"cannot read .*/tcp6"):
        gw.connection_owner(CLIENT_AT, GATEWAY_AT, (str(tcp), str(tcp6)), byteorder="little")
    with pytest.raises(gw.OwnerUnknown, match=r"^cannot read .*/nothing: No such file"):
        gw.connection_owner(CLIENT_AT, GATEWAY_AT, (str(tmp_path / "nothing"),), byteorder="little")


def test_a_table_is_read_only_up_to_its_size_bound(tmp_path):
    big = tmp_path / "tcp"
    big.write_text(HEADER + "".join(row(i, "0100007F:1000", "0100007F:2000", "01", 7, i) for i in range(1, 200)) + TCP)
    with pytest.raises(gw.OwnerUnknown, match="longer than 4096 bytes"):
        gw.connection_owner(CLIENT_AT, GATEWAY_AT, (str(big),), max_bytes=4096, byteorder="little")
    assert gw.connection_owner(CLIENT_AT, GATEWAY_AT, (str(big),), byteorder="little") == 1001


def test_the_decision_passes_only_the_gateways_own_uid():
    assert gw.refusal(1000, 1000) is None
    assert gw.refusal(1001, 1000) == "its socket belongs to uid 1001, not to this gateway's uid 1000"
    assert gw.refusal(0, 1000) is not None  # root's socket is not the user's either


class _Accepted:
    """What asyncio gives the gateway for an accepted connection: its two addresses."""

    def __init__(self, peer=("127.0.0.1", 51000), ours=("127.0.0.1", 2381)):
        self.info = {"peername": peer, "sockname": ours}

    def get_extra_info(self, name):
        return self.info.get(name)


@pytest.fixture
def gateway_of(tmp_path, monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    certs = write_run_certificates(tmp_path / "secrets" / "etcd")
    monkeypatch.setattr(gw, "OWNER_RETRY_S", 0)

    def make(owners):
        """A gateway of uid 1000 whose lookups answer `owners` in turn (an int, or an OwnerUnknown to raise)."""
        looked_up = []

        def owner_of(client, server):
            looked_up.append((client, server))
            answer = owners[min(len(looked_up), len(owners)) - 1]
            if isinstance(answer, Exception):
                raise answer
            return answer
        g = gw.Gateway([("127.0.0.1", 2379)], str(certs), uid=1000, owner_of=owner_of)
        return g, looked_up
    return make


def test_a_connection_of_the_gateways_own_user_passes(gateway_of, capsys):
    g, looked_up = gateway_of([1000])
    assert asyncio.run(g.admit(_Accepted()))
    assert looked_up == [(CLIENT_AT, GATEWAY_AT)] and capsys.readouterr().err == ""


def test_a_connection_of_another_user_is_refused_and_the_refusal_is_logged(gateway_of, capsys):
    g, looked_up = gateway_of([1001])
    assert not asyncio.run(g.admit(_Accepted()))
    assert len(looked_up) == 1  # an owner that is known is not asked again
    assert capsys.readouterr().err == ("etcd_gateway: refused a connection from 127.0.0.1:51000: its socket belongs to "
                                       "uid 1001, not to this gateway's uid 1000\n")


def test_an_owner_that_cannot_be_established_refuses_the_connection_after_a_bounded_retry(gateway_of, capsys):
    g, looked_up = gateway_of([gw.OwnerUnknown("no established socket x")])
    assert not asyncio.run(g.admit(_Accepted()))
    assert len(looked_up) == gw.OWNER_TRIES
    assert "refused a connection from 127.0.0.1:51000: its owner cannot be established: no established socket x" in (
        capsys.readouterr().err)
    g, looked_up = gateway_of([gw.OwnerUnknown("missed while the table changed"), 1000])
    assert asyncio.run(g.admit(_Accepted()))  # a row missed once is found on the next read
    assert len(looked_up) == 2


def test_a_connection_that_is_not_tcp_over_ip_is_refused(gateway_of, capsys):
    g, looked_up = gateway_of([1000])
    assert not asyncio.run(g.admit(_Accepted(peer=None)))
    assert looked_up == [] and "not a TCP connection over IP" in capsys.readouterr().err


def test_refusals_are_logged_at_a_bounded_rate_then_counted(gateway_of, capsys, monkeypatch):
    g, _ = gateway_of([1001])
    clock = [1000.0]
    monkeypatch.setattr(gw.time, "monotonic", lambda: clock[0])
    for _ in range(gw.REFUSALS_LOGGED_PER_MIN + 15):
        assert not asyncio.run(g.admit(_Accepted()))
    assert capsys.readouterr().err.count("refused a connection") == gw.REFUSALS_LOGGED_PER_MIN
    clock[0] += 61
    assert not asyncio.run(g.admit(_Accepted()))
    err = capsys.readouterr().err.splitlines()
    assert err == ["etcd_gateway: 15 more connections refused in the last minute",
                   "etcd_gateway: refused a connection from 127.0.0.1:51000: its socket belongs to uid 1001, not to "
                   "this gateway's uid 1000"]


# --- the exact lookup: the kernel's socket diagnostics ---------------------------------------------------------------

def test_the_socket_diagnostics_request_is_laid_out_as_the_kernel_reads_it():
    """linux/netlink.h nlmsghdr, linux/inet_diag.h inet_diag_req_v2 and inet_diag_sockid (native-endian header
    fields, ports and addresses in network order); SOCK_DIAG_BY_FAMILY (20) without NLM_F_DUMP: one exact lookup."""
    req = gw.diag_request(CLIENT_AT, GATEWAY_AT, 7)
    assert len(req) == 16 + 8 + 48
    assert req[:16] == (72).to_bytes(4, "little") + (20).to_bytes(2, "little") + (1).to_bytes(2, "little") + \
        (7).to_bytes(4, "little") + bytes(4)
    assert req[16:24] == bytes([2, 6, 0, 0]) + (2).to_bytes(4, "little")  # AF_INET, TCP, established only
    assert req[24:28] == (51000).to_bytes(2, "big") + (2381).to_bytes(2, "big")  # the client's port first
    assert req[28:44] == bytes([127, 0, 0, 1]) + bytes(12) and req[44:60] == bytes([127, 0, 0, 1]) + bytes(12)
    assert req[60:72] == bytes(4) + b"\xff" * 8  # no interface, no cookie
    assert gw.diag_request(addr("::1", 5), addr("::1", 6), 1)[16] == 10  # AF_INET6


def _reply(seq, state=1, uid=1000, kind=20):
    body = bytes([2, state, 0, 0]) + bytes(48) + bytes(12) + uid.to_bytes(4, "little") + bytes(4)
    return (16 + len(body)).to_bytes(4, "little") + kind.to_bytes(2, "little") + bytes(2) + \
        seq.to_bytes(4, "little") + bytes(4) + body


def test_a_reply_gives_the_owner_only_for_an_established_socket_of_its_own_request():
    assert gw.diag_owner(_reply(7, uid=1001), 7) == 1001
    assert gw.diag_owner(_reply(6), 7) is None  # an earlier request's late reply: read on
    with pytest.raises(gw.OwnerUnknown, match="TCP state 6, not established"):
        gw.diag_owner(_reply(7, state=6, uid=0), 7)  # a TIME_WAIT shows uid 0
    enoent = (20).to_bytes(4, "little") + (2).to_bytes(2, "little") + bytes(2) + (7).to_bytes(4, "little") + \
        bytes(4) + (-2).to_bytes(4, "little", signed=True)
    with pytest.raises(gw.OwnerUnknown, match="no such established socket"):
        gw.diag_owner(enoent, 7)
    with pytest.raises(gw.OwnerUnknown, match="short message"):
        gw.diag_owner(b"\0" * 8, 7)


def test_the_exact_lookup_finds_this_processs_own_connection_on_this_kernel():
    import os
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    try:
        owners, why = gw.exact_owners(listener)
        if owners is None:
            pytest.skip(f"no socket diagnostics here: {why}")
        client = socket.create_connection(listener.getsockname())
        accepted, peer = listener.accept()
        try:
            ours = accepted.getsockname()
            assert owners(addr(*peer[:2]), addr(*ours[:2])) == os.getuid()
            with pytest.raises(gw.OwnerUnknown, match="no such established socket"):
                owners(addr(peer[0], 1), addr(*ours[:2]))
        finally:
            client.close()
            accepted.close()
            owners.close()
    finally:
        listener.close()


# --- another user's connections cannot push the run's own out ---------------------------------------------------------

class _Conn(_Accepted):
    def __init__(self, port):
        super().__init__(peer=("127.0.0.1", port))
        self.closed = False

    def close(self):
        self.closed = True


def test_refused_connections_never_take_the_places_of_the_users_own(gateway_of, capsys, monkeypatch):
    """Hostile round 4, H1: another user's connections, refused or still being looked up, took MAX_CONNECTIONS slots,
    and the run's own worker was closed without a line."""
    flood, own = range(40000, 40000 + gw.MAX_CONNECTIONS + 10), 51000
    carried = []

    def owner_of(client, server):
        if client[1] == own:
            return 1000
        raise gw.OwnerUnknown("the other user's socket is gone already")
    g, _ = gateway_of([1000])
    g.owner_of, g.exact = owner_of, True
    monkeypatch.setattr(gw, "OWNER_RETRY_S", 0.2)  # the flood's lookups are retried meanwhile

    async def carry(reader, writer):
        carried.append(writer.info["peername"][1])

    g.carry = carry

    async def main():
        others = [asyncio.ensure_future(g.handle(None, _Conn(p))) for p in flood]
        await asyncio.sleep(0.05)  # every one of them is being looked up again
        mine = _Conn(own)
        await g.handle(None, mine)
        await asyncio.gather(*others)
        return mine
    mine = asyncio.run(main())
    assert carried == [own] and mine.closed and g.active == 0
    assert "refused a connection from 127.0.0.1:40000: its owner cannot be established" in capsys.readouterr().err


def test_a_connection_past_the_cap_of_the_users_own_is_refused_with_a_line(gateway_of, capsys):
    g, _ = gateway_of([1000])
    g.active = gw.MAX_CONNECTIONS
    conn = _Conn(51000)
    asyncio.run(g.handle(None, conn))
    assert conn.closed and g.active == gw.MAX_CONNECTIONS
    assert f"the gateway carries {gw.MAX_CONNECTIONS} connections of its user already" in capsys.readouterr().err


def test_the_socket_table_lookup_runs_off_the_event_loop_and_is_bounded(tmp_path, monkeypatch, capsys):
    """Where the kernel has no socket diagnostics: a table read that takes long (18 k sockets: 35 ms a pass) must not
    stop the loop, which carries the run's own heartbeats meanwhile."""
    import time as time_mod
    from toolkit.runtime.tls import write_run_certificates
    certs = write_run_certificates(tmp_path / "secrets" / "etcd")

    def slow_owner(client, server):
        time_mod.sleep(0.3)
        return 1000
    g = gw.Gateway([("127.0.0.1", 2379)], str(certs), uid=1000, owner_of=slow_owner)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        t = asyncio.ensure_future(ticker())
        admitted = await g.admit(_Accepted())
        t.cancel()
        return admitted, ticks
    admitted, ticks = asyncio.run(main())
    assert admitted and ticks >= 10, f"the loop ran {ticks} times during a 0.3 s lookup"
    monkeypatch.setattr(gw, "OWNER_LOOKUP_TIMEOUT_S", 0.05)
    g = gw.Gateway([("127.0.0.1", 2379)], str(certs), uid=1000, owner_of=slow_owner)
    assert not asyncio.run(g.admit(_Accepted()))
    assert "the socket tables were not read within 0.05s" in capsys.readouterr().err
    monkeypatch.setattr(gw, "MAX_PENDING_LOOKUPS", 0)
    assert not asyncio.run(g.admit(_Accepted()))
    assert "0 connections are waiting for their owner already" in capsys.readouterr().err


def test_every_connection_waiting_for_its_owner_is_answered_by_one_pass_over_the_tables():
    """Hostile round 4, H1: one pass per connection (x3 when not found) made a burst of 256 connections cost hundreds
    of passes. Now the connections waiting when a pass begins share it."""
    passes = []

    def read(pairs):
        passes.append(len(pairs))
        return {p: (1000 if p[0][1] == 51000 else 65534) for p in pairs}

    async def main():
        tables = gw.TableOwners(read)
        mine = asyncio.ensure_future(tables.owner(CLIENT_AT, GATEWAY_AT))
        others = [asyncio.ensure_future(tables.owner(addr("127.0.0.3", 40000 + i), GATEWAY_AT)) for i in range(255)]
        return await mine, await asyncio.gather(*others)
    mine, others = asyncio.run(main())
    assert mine == 1000 and set(others) == {65534}
    assert passes == [256]


def test_one_pass_over_the_tables_finds_every_connection_it_was_asked_for(tmp_path):
    tcp = tmp_path / "tcp"
    tcp.write_text(TCP + row(4, "0100007F:C73A", "0100007F:094D", "01", 1005, 4005))
    other = addr("127.0.0.1", 0xC73A)
    gone = addr("127.0.0.1", 0xC739)  # its TIME_WAIT row only
    owners = gw.owners_in_tables([(CLIENT_AT, GATEWAY_AT), (other, GATEWAY_AT), (gone, GATEWAY_AT)], (str(tcp),),
                                 byteorder="little")
    assert owners[(CLIENT_AT, GATEWAY_AT)] == 1001 and owners[(other, GATEWAY_AT)] == 1005
    assert owners[(gone, GATEWAY_AT)].startswith("no established socket 127.0.0.1:51001 -> 127.0.0.1:2381 in ")


def test_a_gateway_that_fails_says_so_and_ends_its_server(gateway_of, capsys, monkeypatch):
    import os
    import signal
    g, _ = gateway_of([1000])
    ended = []

    async def broken(sock, gateway, parent):
        raise RuntimeError("the loop broke")
    monkeypatch.setattr(gw, "serve", broken)
    with _handlers_restored(gw.ENDING_SIGNALS):
        assert gw.run_beside(None, g, os.getppid(), end_server=lambda pid, sig: ended.append((pid, sig))) == 1
    assert ended == [(os.getppid(), signal.SIGTERM)]
    line = capsys.readouterr().err.strip()
    assert line.startswith('etcd_gateway: background-failed {"task": "gateway", "component": "etcd-gateway", '
                           '"cause": "RuntimeError: the loop broke"')


def test_the_gateway_ends_with_its_server_on_every_signal_that_ends_the_job_s_orchestrator():
    """A signal whose default ends a process and that the gateway did not handle (SIGVTALRM, SIGPROF, SIGIO, SIGXCPU,
    the real-time ones) ended it without a word: its server went on answering /health with no way to the storage,
    out of the routing until supervision saw it unregistered and killed it 30 s later (review of issue 31, on a live
    run). The gateway ends on each of the job's ending signals, says so and ends its server at once."""
    import signal

    from orchestrator.job import ENDING_SIGNALS
    assert set(ENDING_SIGNALS) - set(gw.ENDING_SIGNALS) == set()
    assert signal.SIGUSR2 in gw.ENDING_SIGNALS  # the gateway prints no stacks on it: it ends too
    assert not {signal.SIGPIPE, signal.SIGCHLD, signal.SIGKILL} & set(gw.ENDING_SIGNALS)


@pytest.mark.parametrize("name", ["SIGVTALRM", "SIGPROF", "SIGIO", "SIGXCPU", "SIGRTMIN"])
def test_a_signalled_gateway_says_which_signal_and_ends_its_server(gateway_of, capsys, monkeypatch, name):
    import os
    import signal
    g, _ = gateway_of([1000])
    sig = getattr(signal, name)
    ended = []

    async def signalled(sock, gateway, parent):
        os.kill(os.getpid(), sig)
        await asyncio.sleep(0.5)
    monkeypatch.setattr(gw, "serve", signalled)
    with _handlers_restored({*gw.ENDING_SIGNALS, sig}):
        signal.signal(sig, lambda *_: None)  # a gateway that leaves it alone must not end the test run with it
        assert gw.run_beside(None, g, os.getppid(), end_server=lambda pid, s: ended.append((pid, s))) == 1
    assert ended == [(os.getppid(), signal.SIGTERM)]
    assert f"etcd_gateway: ended by {name}" in capsys.readouterr().err


def test_a_failing_connection_handler_is_said_and_the_gateway_goes_on(gateway_of, capsys):
    g, _ = gateway_of([1000])

    async def carry(reader, writer):
        raise KeyError("a bug")
    g.carry = carry
    conn = _Conn(51000)
    asyncio.run(g.handle(None, conn))
    assert conn.closed and g.active == 0
    assert '"task": "connection", "component": "etcd-gateway", "cause": "KeyError: \'a bug\'"' in \
        capsys.readouterr().err


def test_the_event_loops_own_complaints_are_the_gateways_structured_line_but_a_cancellation_is_not_one(capsys):
    gw._loop_exception(None, {"message": "Task exception was never retrieved", "exception": OSError("EMFILE")})
    gw._loop_exception(None, {"message": "x", "exception": asyncio.CancelledError()})
    err = capsys.readouterr().err.splitlines()
    assert err == ['etcd_gateway: background-failed {"task": "event-loop", "component": "etcd-gateway", '
                   '"cause": "OSError: EMFILE", "then": "the gateway goes on"}']
