import pytest

from tests.llama_cpp.build import Build, pinned_version
from tests.llama_cpp.tiny_model import write_tiny_llama


@pytest.fixture(scope="session")
def llama_build(pytestconfig) -> Build:
    """llama.cpp's server, built on the first run on this machine and cached for later ones."""
    build = Build(pinned_version())
    if not build.ready():
        capture = pytestconfig.pluginmanager.getplugin("capturemanager")
        reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            build.ensure(say=reporter.write_line)
    return build


@pytest.fixture(scope="session")
def tiny_llama(llama_build, tmp_path_factory):
    """A tiny random-weights llama (a few MB of GGUF), written for this run."""
    return write_tiny_llama(llama_build.vocab, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
