"""What an engine's environment takes from the agent's: a home and a model cache it can write,
and nothing systemd meant for the agent alone."""

from controlplane.agent.engineenv import engine_environment


def test_an_agent_without_a_writable_home_gives_its_engines_one_and_a_cache(tmp_path):
    agent = {
        "HOME": "/",
        "CACHE_DIRECTORY": f"{tmp_path}/cache:{tmp_path}/other",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "30000000",
        "CREDENTIALS_DIRECTORY": "/run/credentials/gpuctl-agent.service",
        "PATH": "/usr/bin",
    }
    env = engine_environment(tmp_path / "node", agent)
    assert env["HOME"] == str(tmp_path / "node" / "home")
    assert (tmp_path / "node" / "home").is_dir()
    assert env["HF_HOME"] == str(tmp_path / "cache" / "huggingface")
    assert env["PATH"] == "/usr/bin"
    for gone in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "CREDENTIALS_DIRECTORY"):
        assert gone not in env
    assert "NOTIFY_SOCKET" in agent, "the agent's own is left as it was"


def test_what_the_agent_already_has_is_kept(tmp_path):
    agent = {"HOME": str(tmp_path), "HF_HOME": "/models/hf", "CACHE_DIRECTORY": "/var/cache/x"}
    env = engine_environment(tmp_path / "node", agent)
    assert env["HOME"] == str(tmp_path) and env["HF_HOME"] == "/models/hf"
    assert not (tmp_path / "node").exists()
