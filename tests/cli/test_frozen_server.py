"""A server that accepts connections and never answers (SIGSTOP, a half-dead VM, a
black-holed route), listed first: reads move on to the next server, changes are sent only
where a leader answers, and a change whose answer does not come is reported as possibly made,
never sent twice."""

import json
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cli import client
from tests.controlplane.conftest import make_node, spec
from tests.harness import BIN, call, control_plane


@pytest.fixture
def frozen():
    """A listener whose connections complete in the kernel and are never read."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def gpuctl(servers: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "gpuctl"), "--server", servers, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"NO_COLOR": "1", "PATH": ""},
    )


def test_a_frozen_server_listed_first_costs_reads_and_writes_nothing_but_time(
    procs, tmp_path, frozen
):
    url, _ = control_plane(procs, tmp_path / "state.sqlite")
    assert call("POST", url + "/v1/nodes", make_node("n1", gpus=2))[0] == 201
    assert call("POST", url + "/v1/models", spec(name="m", replicas=1))[0] == 201
    servers = f"{frozen},{url}"
    shown = gpuctl(servers, "status", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["nodes"]["total"] == 1
    scaled = gpuctl(servers, "scale", "m", "2")
    assert scaled.returncode == 0, scaled.stderr
    assert len(call("GET", url + "/v1/models/m")[1]["replicas"]) == 2


class LeaderThatHangsOnWrites(BaseHTTPRequestHandler):
    writes = 0

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self):  # noqa: N802
        type(self).writes += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        threading.Event().wait(5)  # past the client's timeout: the answer never comes in time

    def log_message(self, *args):
        pass


def test_a_change_whose_answer_does_not_come_is_possibly_made_and_not_sent_again():
    server = ThreadingHTTPServer(("127.0.0.1", 0), LeaderThatHangsOnWrites)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    leader = f"http://127.0.0.1:{server.server_address[1]}"
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening
        try:
            with pytest.raises(client.ApiError) as raised:
                client.request(f"{leader},{refused}", "POST", "/v1/models", {}, timeout=1.0)
        finally:
            server.shutdown()
            server.server_close()
    assert "may have been made" in raised.value.message and leader in raised.value.message
    assert LeaderThatHangsOnWrites.writes == 1, "sent once, never again"
