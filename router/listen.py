"""HOST:PORT, as gpurouter's --listen takes it (gpuctl's commands take it the same way)."""


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)
