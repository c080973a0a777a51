"""Spec: the local backend's port check. A port something listens on is "in use" (and a tk run holding it is
named); a port held only by the local end of a connection (a client's ephemeral source port) is reported as that,
with the ephemeral range, never as a process to stop."""

from __future__ import annotations

import socket

import pytest

from toolkit import api
from toolkit.launch.backends import LaunchError, LocalBackend
from toolkit.runtime import ports


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv
    srv.close()


# Below Linux's ephemeral range (32768-60999), where the listener's port (bound to 0) lands: the plan's own worker and
# internal ports never collide with it.
def _plan(proxy_port: int, base: int = 21871):
    return api.load_plan("standin-2p2d", [f"proxy.port={proxy_port}", f"cluster.worker_base_port={base}"])


def test_listening_ports_are_read_from_the_kernel_tables(tmp_path, listener):
    assert listener.getsockname()[1] in ports.listening_ports()
    table = tmp_path / "tcp"
    table.write_text("  sl  local_address rem_address   st\n"
                     "   0: 0100007F:1F90 00000000:0000 0A\n"      # 127.0.0.1:8080 LISTEN
                     "   1: 0100007F:9C46 0100007F:1F90 01\n")     # 127.0.0.1:40006 ESTABLISHED
    assert ports.listening_ports((str(table),)) == {8080}


def test_a_listened_port_is_in_use_and_the_message_says_how_to_find_its_holder(listener):
    port = listener.getsockname()[1]
    with pytest.raises(LaunchError) as info:
        LocalBackend().preflight(_plan(port))
    text = str(info.value)
    assert f"port {port} (proxy) is already in use on this machine: something listens on it" in text
    assert f"ss -ltnp 'sport = :{port}'" in text


def test_a_port_held_by_a_tk_run_names_the_run(listener, tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    port = listener.getsockname()[1]
    other = api.prepare(_plan(port, base=21901), local=True, run_dir=tmp_path / "runs" / "other-run")
    other.set_state("ready")
    with pytest.raises(LaunchError, match=r"the tk run other-run: `tk stop other-run`"):
        LocalBackend().preflight(_plan(port))


def test_a_port_held_by_a_connection_is_not_called_a_listener(listener, monkeypatch):
    monkeypatch.setattr("toolkit.launch.backends.PORT_WAIT_S", 0.3)
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    try:
        port = client.getsockname()[1]  # the client's ephemeral source port: nothing listens there
        assert port not in ports.listening_ports() and not ports.bindable(port)
        with pytest.raises(LaunchError) as info:
            LocalBackend().preflight(_plan(port))
        text = str(info.value)
        assert "held on this machine by the local end of a connection, not by a listener" in text
        assert "already in use" not in text and "stop what holds" not in text
        low, high = ports.ephemeral_range()
        assert f"ephemeral ports are {low}-{high}" in text
    finally:
        client.close()
        accepted.close()


def _listen_below_ephemeral(start: int) -> socket.socket:
    for port in range(start, start + 200):
        srv = socket.socket()
        try:
            srv.bind(("127.0.0.1", port))
            srv.listen()
            return srv
        except OSError:
            srv.close()
    pytest.skip("no free port to listen on")


@pytest.mark.parametrize("offset,what", [(0, "etcd client"), (1, "etcd peer"), (2, "etcd gateway")])
def test_every_port_a_run_binds_is_checked_and_names_the_setting_that_moves_it(offset, what):
    """Hostile round 4 (m6): the etcd client, peer and gateway ports were not checked, so a taken one failed the job
    later with etcd's or the gateway's own bind error."""
    srv = _listen_below_ephemeral(24210)
    try:
        port = srv.getsockname()[1]
        plan = api.load_plan("standin-2p2d", ["membership.enabled=true", f"membership.etcd_port={port - offset}",
                                              "cluster.worker_base_port=39871", "proxy.port=39861"])
        assert any(b.port == port and b.setting == "membership.etcd_port" for b in plan.bound_ports)
        with pytest.raises(LaunchError) as info:
            LocalBackend().preflight(plan)
        text = str(info.value)
        assert f"port {port} (" in text and what in text and "move membership.etcd_port" in text
        assert "worker_base_port" not in text
    finally:
        srv.close()


def test_the_bound_ports_are_the_ports_by_node_with_their_settings():
    plan = api.load_plan("standin-2p2d", ["membership.enabled=true"])
    by_node = [[] for _ in range(plan.node_count)]
    for b in plan.bound_ports:
        by_node[b.node].append(b.port)
    assert tuple(tuple(sorted(p)) for p in by_node) == plan.ports_by_node
    settings = {b.setting for b in plan.bound_ports}
    assert settings == {"cluster.worker_base_port", "proxy.port", "membership.etcd_port"} | (
        {"cluster.internal_base_port"} if any(s.internal_ports for s in plan.servers) else set())
