"""Strict validation of what operators apply: model specs, durations, sizes, names."""

from __future__ import annotations

import re

from controlplane.vocabulary.model import ENGINE_KINDS, ModelSpec

NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
PLACEHOLDERS = {
    "port",
    "model",
    "gpus",
    "replica",
    "rank",
    "nnodes",
    "master_addr",
    "host",
    "gpu_memory_utilization",  # the share of each card its engine may take awake (vLLM's flag)
}


class SpecError(ValueError):
    """A spec was refused; `field` names what is wrong."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


SPEC_FIELDS = {
    "name",
    "gpu_class",
    "command",
    "gpus_per_replica",
    "nodes_per_replica",
    "replicas",
    "env",
    "env_from",
    "health_path",
    "idle_after",
    "idle_after_s",
    "generation",
    "min_replicas",
    "scale_to_zero_after",
    "scale_to_zero_after_s",
    "affinity",
    "priority",
    "min_residency",
    "min_residency_s",
    "max_replicas",
    "target_in_flight",
    "target_waiting",
    "scale_down_delay",
    "scale_down_delay_s",
    "engine",
    "engine_endpoints",
    "sleep",
    "sleep_level",
    "sleep_after_s",
    "wake_timeout_s",
    "gpu_memory",
    "gpu_memory_mb",
    "sleep_gpu_memory",
    "sleep_gpu_memory_mb",
    "sleep_host_memory",
    "sleep_host_memory_mb",
    "max_adapters",
    "adapter_resolver",
    "owner",
}
SLEEP_FIELDS = {"level", "after", "wake_timeout"}
ENDPOINT_NAMES = ("sleep", "wake", "asleep")
SIZE_UNITS = {  # in MiB
    "": 1,
    "mib": 1,
    "gib": 1024,
    "tib": 1024 * 1024,
    "mb": 1e6 / 2**20,
    "gb": 1e9 / 2**20,
    "tb": 1e12 / 2**20,
}
PRIORITY_RANGE = (-1_000_000, 1_000_000)
AFFINITY_MODES = ("off", "session", "prefix")


def format_duration(seconds: float) -> str:
    """90 -> 90s, 120 -> 2m, 7200 -> 2h: the shortest exact unit."""
    seconds = int(round(seconds))
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def parse_duration(value, field_name: str, allow_zero: bool = False) -> float:
    """Seconds from a number or a string like 90s, 30m, 2h."""
    if isinstance(value, bool):
        raise SpecError(field_name, "expected a duration such as 30m")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?[smhd]?", value.strip()):
        text = value.strip()
        unit = text[-1] if text[-1] in "smhd" else "s"
        number = float(text.rstrip("smhd"))
        seconds = number * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    else:
        raise SpecError(field_name, f"expected a duration such as 30m, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise SpecError(field_name, "must not be negative" if allow_zero else "must be positive")
    return seconds


def parse_size(value, field_name: str) -> int:
    """MiB from a size such as 60GB, 512MiB or 1.5GiB (a bare number is MiB, as NVML's)."""
    if isinstance(value, bool):
        raise SpecError(field_name, "expected a size such as 60GB")
    if isinstance(value, int | float):
        mib = float(value)
    elif isinstance(value, str) and (
        match := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)", value.strip())
    ):
        unit = match.group(2).lower()
        if unit not in SIZE_UNITS:
            raise SpecError(field_name, f"unknown unit {match.group(2)!r}: use MB, GB, MiB or GiB")
        mib = float(match.group(1)) * SIZE_UNITS[unit]
    else:
        raise SpecError(field_name, f"expected a size such as 60GB, got {value!r}")
    if mib < 0:
        raise SpecError(field_name, "must not be negative")
    return int(mib)


def _one_of(body: dict, short: str, long: str):
    """The value given as `short` or `long` (a stored spec's name), never both."""
    if short in body and long in body:
        raise SpecError(short, f"give {short} or {long}, not both")
    return body.get(short, body.get(long))


def _sleep_settings(body: dict) -> dict:
    """The ModelSpec fields of sleeping engines, from `engine`, `sleep` and the sizes."""
    engine = body.get("engine")
    endpoints = body.get("engine_endpoints") or {}
    if isinstance(engine, dict):
        endpoints, engine = engine, "custom"
    if engine is not None and engine not in (*ENGINE_KINDS, "custom"):
        raise SpecError(
            "engine", f"one of {', '.join(ENGINE_KINDS)}, or a map of {', '.join(ENDPOINT_NAMES)}"
        )
    if engine == "custom":
        if not isinstance(endpoints, dict) or set(endpoints) != set(ENDPOINT_NAMES):
            raise SpecError("engine", f"a map of exactly {', '.join(ENDPOINT_NAMES)} paths")
        for name, path in endpoints.items():
            if not isinstance(path, str) or not path.startswith("/"):
                raise SpecError(f"engine.{name}", "a path starting with /")
    elif endpoints:
        raise SpecError("engine_endpoints", "only with engine: custom (a map of paths)")
    sleep = body.get("sleep")
    level = body.get("sleep_level")
    after = body.get("sleep_after_s")
    wake_timeout = body.get("wake_timeout_s", 120.0)
    if sleep is not None:
        if level is not None or after is not None:
            raise SpecError("sleep", "give sleep: {level, after}, or sleep_level, not both")
        if not isinstance(sleep, dict) or set(sleep) - SLEEP_FIELDS:
            raise SpecError("sleep", f"a map of {', '.join(sorted(SLEEP_FIELDS))}")
        level, after = sleep.get("level", 1), sleep.get("after")
        wake_timeout = sleep.get("wake_timeout", wake_timeout)
    if level is not None:
        if level not in (1, 2) or isinstance(level, bool):
            raise SpecError("sleep.level", "1 (weights kept in host memory) or 2 (dropped)")
        if engine is None:
            raise SpecError(
                "engine", "required with sleep: vllm, sglang, llama.cpp or a map of paths"
            )
    if after is not None:
        if level is None:
            raise SpecError("sleep.level", "required with sleep.after")
        after = parse_duration(after, "sleep.after")
    sizes = {
        name: None if (value := _one_of(body, name, name + "_mb")) is None
        else parse_size(value, name)
        for name in ("gpu_memory", "sleep_gpu_memory", "sleep_host_memory")
    }  # fmt: skip
    if sizes["gpu_memory"] == 0:
        raise SpecError("gpu_memory", "must be positive")
    return {
        "engine": engine,
        "engine_endpoints": dict(endpoints),
        "sleep_level": level,
        "sleep_after_s": after,
        "wake_timeout_s": parse_duration(wake_timeout, "sleep.wake_timeout"),
        "gpu_memory_mb": sizes["gpu_memory"],
        "sleep_gpu_memory_mb": sizes["sleep_gpu_memory"],
        "sleep_host_memory_mb": sizes["sleep_host_memory"],
    }


def parse_name(body: dict) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise SpecError(
            "name",
            "lower-case letters, digits, '.', '_' or '-', 1-63 characters, "
            "starting and ending with a letter or digit",
        )
    return name


def parse_priority(body: dict) -> int:
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise SpecError("priority", f"expected an integer, got {priority!r}")
    if not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
        raise SpecError("priority", "must be between -1000000 and 1000000")
    return priority


def parse_idle_after(body: dict) -> float:
    if "idle_after" in body and "idle_after_s" in body:
        raise SpecError("idle_after", "give idle_after or idle_after_s, not both")
    return parse_duration(body.get("idle_after", body.get("idle_after_s", 1800)), "idle_after")


def _positive_int(body: dict, name: str, default: int, allow_zero: bool = False) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(name, f"expected an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SpecError(name, "must be positive" if not allow_zero else "must not be negative")
    return value


def validate_spec(body) -> ModelSpec:
    """A ModelSpec from an operator's mapping, or SpecError naming the first bad field."""
    if not isinstance(body, dict):
        raise SpecError("spec", "expected a mapping")
    unknown = sorted(set(body) - SPEC_FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(sorted(SPEC_FIELDS))})")
    name = parse_name(body)
    gpu_class = body.get("gpu_class")
    if not isinstance(gpu_class, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", gpu_class):
        raise SpecError("gpu_class", "required, such as H100-80GB")
    command = body.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise SpecError(
            "command", "must be a non-empty list of strings (an argv, never a shell line)"
        )
    for arg in command:
        for placeholder in re.findall(r"\{([^{}]*)\}", arg):
            if placeholder not in PLACEHOLDERS:
                raise SpecError(
                    "command",
                    f"unknown placeholder {{{placeholder}}}; known: "
                    + ", ".join(sorted(PLACEHOLDERS)),
                )
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and isinstance(v, str)
        for k, v in env.items()
    ):
        raise SpecError("env", "must map variable names to strings")
    env_from = body.get("env_from") or {}
    if not isinstance(env_from, dict):
        raise SpecError("env_from", "must map variable names to {file: PATH} or {agent_env: NAME}")
    for variable, source in env_from.items():
        if not isinstance(variable, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
            raise SpecError("env_from", f"{variable!r} is not a variable name")
        if (
            not isinstance(source, dict)
            or len(source) != 1
            or next(iter(source)) not in ("file", "agent_env")
            or not isinstance(next(iter(source.values())), str)
            or not next(iter(source.values()))
        ):
            raise SpecError(
                f"env_from.{variable}", "one of {file: PATH} or {agent_env: NAME}, a string"
            )
        if variable in env:
            raise SpecError(f"env_from.{variable}", "also set in env: give it in one place")
    health_path = body.get("health_path", "/health")
    if not isinstance(health_path, str) or not health_path.startswith("/"):
        raise SpecError("health_path", "must be a path starting with /")
    idle = parse_idle_after(body)
    generation = body.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise SpecError("generation", "must be a non-negative integer")
    replicas = _positive_int(body, "replicas", 1, allow_zero=True)
    min_replicas = None
    if body.get("min_replicas") is not None:
        min_replicas = _positive_int(body, "min_replicas", 0, allow_zero=True)
        if min_replicas > replicas:
            raise SpecError("min_replicas", f"must not exceed replicas ({replicas})")
    if "scale_to_zero_after" in body and "scale_to_zero_after_s" in body:
        raise SpecError("scale_to_zero_after", "give scale_to_zero_after or _s, not both")
    scale_after = body.get("scale_to_zero_after", body.get("scale_to_zero_after_s"))
    if scale_after is not None:
        scale_after = parse_duration(scale_after, "scale_to_zero_after")
    max_replicas = None
    if body.get("max_replicas") is not None:
        max_replicas = _positive_int(body, "max_replicas", 0, allow_zero=True)
        if max_replicas < replicas:
            raise SpecError("max_replicas", f"must be at least replicas ({replicas})")
    target = body.get("target_in_flight")
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, int | float) or target <= 0
    ):
        raise SpecError("target_in_flight", f"a positive number of requests, got {target!r}")
    if target is None and max_replicas is not None and max_replicas > replicas:
        raise SpecError(
            "target_in_flight", "required with max_replicas above replicas: it is what scales"
        )
    target_waiting = body.get("target_waiting")
    if target_waiting is not None:
        if (
            isinstance(target_waiting, bool)
            or not isinstance(target_waiting, int | float)
            or not 0 < target_waiting < float("inf")
        ):
            raise SpecError(
                "target_waiting",
                f"a positive number of requests queued per replica, got {target_waiting!r}",
            )
        if target is None:
            raise SpecError(
                "target_waiting", "needs target_in_flight, which decides when to scale in"
            )
    if "scale_down_delay" in body and "scale_down_delay_s" in body:
        raise SpecError("scale_down_delay", "give scale_down_delay or _s, not both")
    delay = body.get("scale_down_delay", body.get("scale_down_delay_s", 300))
    priority = parse_priority(body)
    if "min_residency" in body and "min_residency_s" in body:
        raise SpecError("min_residency", "give min_residency or min_residency_s, not both")
    residency = body.get("min_residency", body.get("min_residency_s"))
    if residency is not None:
        residency = parse_duration(residency, "min_residency", allow_zero=True)
    affinity = body.get("affinity")
    if affinity is False:  # YAML 1.1 reads a bare `off` as false
        affinity = "off"
    if affinity is not None and affinity not in AFFINITY_MODES:
        raise SpecError("affinity", f"one of {', '.join(AFFINITY_MODES)}")
    return ModelSpec(
        name=name,
        gpu_class=gpu_class,
        command=list(command),
        gpus_per_replica=_positive_int(body, "gpus_per_replica", 1),
        nodes_per_replica=_positive_int(body, "nodes_per_replica", 1),
        replicas=replicas,
        env=dict(env),
        env_from={k: dict(v) for k, v in env_from.items()},
        health_path=health_path,
        idle_after_s=idle,
        generation=generation,
        min_replicas=min_replicas,
        scale_to_zero_after_s=scale_after,
        affinity=affinity,
        priority=priority,
        min_residency_s=residency,
        max_replicas=max_replicas,
        target_in_flight=None if target is None else float(target),
        target_waiting=None if target_waiting is None else float(target_waiting),
        scale_down_delay_s=parse_duration(delay, "scale_down_delay"),
        max_adapters=_positive_int(body, "max_adapters", 0, allow_zero=True),
        adapter_resolver=parse_adapter_resolver(body),
        owner=parse_owner(body),
        **_sleep_settings(body),
    )


def parse_adapter_resolver(body: dict) -> bool:
    """Whether its engines load adapters themselves on a first request (needs max_adapters:
    the free slots a router may send such a request to)."""
    value = body.get("adapter_resolver", False)
    if not isinstance(value, bool):
        raise SpecError("adapter_resolver", "expected true or false")
    if value and not body.get("max_adapters"):
        raise SpecError(
            "adapter_resolver", "needs max_adapters: the adapter slots a resolved load may take"
        )
    return value


def parse_owner(body: dict) -> str | None:
    """The tenant its idle GPU time is charged to (a tenant's name; it need not exist yet)."""
    owner = body.get("owner")
    if owner is None:
        return None
    if not isinstance(owner, str) or not NAME.match(owner):
        raise SpecError("owner", f"a tenant's name (lowercase, digits, . _ -), got {owner!r}")
    return owner
