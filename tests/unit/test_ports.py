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


def _plan(proxy_port: int, base: int = 39871):
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
    other = api.prepare(_plan(port, base=39901), local=True, run_dir=tmp_path / "runs" / "other-run")
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
