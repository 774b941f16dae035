"""What agents tell the fleet: registration, heartbeats with GPU health and each replica's
state, and what each node must run (its assignments) in answer.

A report is an observation: the fleet takes what an engine is (Ready, Failed, asleep, its
adapters) and keeps it; what to do about it is the tick's (controlplane/tick/steps/).
"""

from __future__ import annotations

from dataclasses import replace

from controlplane.rules.held import DEFAULT_SHARE, allowed_mb, engine_gone
from controlplane.vocabulary.errors import BadRequest
from controlplane.vocabulary.idle import SLOT_SEP
from controlplane.vocabulary.model import (
    GPU,
    RESIDENT,
    SELF_WAKING,
    Node,
    Replica,
    ReplicaState,
    memory_over,
)

REPLICA_REPORT_STATES = {
    "Starting",
    "Ready",
    "Unhealthy",
    "Failed",
    "Stopping",
    "Stopped",
    "Asleep",  # its engine sleeps (told to, or by itself)
    "Waking",  # told to wake, not yet healthy
}


class AgentReports:
    """Mixed into Fleet: the calls agents make."""

    def register(self, body) -> Node:
        node = parse_node(body)
        current = self.nodes.get(node.name)
        if current is not None:
            node.schedulable = current.schedulable  # operator states survive re-registration
        node.ready = True
        node.last_heartbeat = self.clock()
        self.store.put_node(node)
        self.nodes[node.name] = node
        self.changed = True
        return node

    def heartbeat(self, name: str, body) -> list[dict]:
        """An agent's heartbeat: GPU health and its replicas' states; returns its assignments."""
        node = self.node(name)
        if not isinstance(body, dict):
            raise BadRequest("heartbeat", "expected a JSON object")
        gpus = body.get("gpus", None)
        reports = body.get("replicas", {})
        if gpus is not None:
            health = parse_gpu_health(gpus)
        if not isinstance(reports, dict):
            raise BadRequest("replicas", "expected a map of replica id to its state")
        for replica_id, report in reports.items():
            if not isinstance(report, dict) or report.get("state") not in REPLICA_REPORT_STATES:
                raise BadRequest(
                    f"replicas.{replica_id}.state",
                    f"one of {', '.join(sorted(REPLICA_REPORT_STATES))}",
                )
            loaded, failed = report.get("adapters", []), report.get("adapter_failures", {})
            if not isinstance(loaded, list) or not all(isinstance(a, str) for a in loaded):
                raise BadRequest(f"replicas.{replica_id}.adapters", "a list of adapter names")
            if not isinstance(failed, dict):
                raise BadRequest(
                    f"replicas.{replica_id}.adapter_failures", "a map of adapter name to reason"
                )
            used = report.get("gpu_memory_mb", 0)
            if isinstance(used, bool) or not isinstance(used, int) or used < 0:
                raise BadRequest(f"replicas.{replica_id}.gpu_memory_mb", "MiB, a whole number >= 0")
        with self.store.batch():
            changed_node = False
            if gpus is not None:
                # A new list of new GPUs, never a change in place: snapshots share the old one.
                fresh = [
                    gpu
                    if health.get(gpu.index, (gpu.healthy, gpu.reason)) == (gpu.healthy, gpu.reason)
                    else replace(gpu, healthy=health[gpu.index][0], reason=health[gpu.index][1])
                    for gpu in node.gpus
                ]
                if any(a is not b for a, b in zip(fresh, node.gpus, strict=True)):
                    node.gpus = fresh
                    changed_node = True
            if not node.ready:
                node.ready = True
                changed_node = True
            if changed_node:
                self.store.put_node(node)
                self.changed = True
            node.last_heartbeat = self.clock()
            for replica_id, report in reports.items():
                self._replica_report(node, replica_id, report)
            if "replicas" in body:  # an agent that says nothing of its engines says none gone
                self._note_gone(node, reports)
            self._forget_stopped(node, reports)
        return self.assignments(name)

    def _replica_report(self, node: Node, replica_id: str, report: dict) -> None:
        replica = self.replicas.get(replica_id)
        if replica is None or node.name not in replica.nodes:
            return  # an agent's leftover: it is not assigned, the agent will stop it
        if node.name in replica.gone_from and report["state"] not in ("Failed", "Stopped"):
            # Its process runs there after all (an agent back from a restart or a partition
            # that had not reported it): it holds that node's cards again.
            replica.gone_from = [n for n in replica.gone_from if n != node.name]
            self.put_replica(replica)
            self.changed = True
        leader = replica.placement[0].node == node.name
        if replica.state == ReplicaState.FAILED and replica.lost and leader:
            self._back_with_node(node, replica, report)
        if replica.state in (ReplicaState.STOPPING, ReplicaState.FAILED):
            return
        if leader:
            self._adapter_report(replica, report)
            self._memory_report(node, replica, report.get("gpu_memory_mb", 0))
        if replica.state == ReplicaState.RETIRING and report["state"] not in ("Failed", "Stopped"):
            return  # Ready as far as its agent knows; retiring as far as the fleet goes
        state = report["state"]
        if leader:
            state = self._self_sleep_report(replica, state)
        if state not in ("Failed", "Stopped") and self._sleep_report(replica, state, leader):
            return
        if state == "Failed" or (state == "Stopped" and replica.state != ReplicaState.STOPPING):
            replica.state = ReplicaState.FAILED
            replica.lost = False  # its engine is gone, wherever its node is
            replica.exit_code = report.get("exit_code")
            replica.reason = str(report.get("reason") or "the engine process exited")[:500]
            replica.log_tail = str(report.get("log_tail") or "")[-4000:]
        elif leader and state in ("Starting", "Ready", "Unhealthy"):
            url = report.get("url") or replica.url
            if (replica.state, replica.url) == (ReplicaState(state), url):
                return
            if state == "Ready" and replica.state != ReplicaState.READY:
                replica.ready_at = self.wall()
                self._swapped_in(replica)
            replica.state = ReplicaState(state)
            replica.url = url if isinstance(url, str) else ""
            replica.reason = str(report.get("reason") or "")[:500]
        else:
            return
        replica.updated_at = self.wall()
        self.put_replica(replica)
        self.changed = True
        self.event(
            replica.model,
            f"replica {replica.id} {replica.state}"
            + (f": {replica.reason}" if replica.reason else ""),
        )

    def _memory_report(self, node: Node, replica: Replica, used_mb: int) -> None:
        """What its engine holds of a card; stored when it crosses what it was started with
        (awake) or its reserve (asleep)."""
        replica.gpu_memory_used_mb = used_mb  # read again each beat: kept in memory only
        card = next((g.memory_mb for g in node.gpus if g.index in replica.placement[0].gpus), 0)
        spec = self.specs.get(replica.model)
        allowed = allowed_mb(replica, card, spec)
        over = memory_over(used_mb, allowed, replica.asleep_held) if card else ""
        if over != replica.memory_over:
            replica.memory_over = over
            self.put_replica(replica)
            self.changed = True
            if over:
                self.event(replica.model, f"replica {replica.id} Degraded: {over}")

    def _back_with_node(self, node: Node, replica: Replica, report: dict) -> None:
        """A replica lost with its node, whose engine its agent still runs: it is what its
        agent says again, never stopped on the spot (routers that could still reach the node
        may be streaming from it); its model's count keeps it or stops it (before the replica
        that replaced it), through the safe stop where it had a route."""
        if report["state"] not in ("Starting", "Ready", "Unhealthy"):
            return
        replica.state = ReplicaState(report["state"])
        if replica.state == ReplicaState.READY and not replica.ready_at:
            replica.ready_at = self.wall()
        url = report.get("url") or replica.url
        replica.url = url if isinstance(url, str) else ""
        replica.reason = f"back with node {node.name}"
        replica.updated_at = self.wall()
        self.put_replica(replica)
        self.changed = True
        self.event(replica.model, f"replica {replica.id} {replica.state}: {replica.reason}")

    def _adapter_report(self, replica: Replica, report: dict) -> None:
        """What the engine holds, and why a load failed: stored when it changed."""
        loaded = report.get("adapters")
        failures = report.get("adapter_failures") or {}
        if loaded is None:
            return
        loaded = sorted(str(a) for a in loaded)
        # Kept here, not only by the agent: a failed load stays failed on this replica until
        # the adapter is applied again, so that nothing retries it in a loop.
        failures = {
            **replica.adapter_failures,
            **{str(k): str(v)[:300] for k, v in failures.items()},
        }
        if (loaded, failures) == (sorted(replica.adapters), replica.adapter_failures):
            return
        for name, why in failures.items():
            if name not in replica.adapter_failures:
                self.event(name, f"failed to load on {replica.id}: {why}")
        gone = set(replica.adapters) - set(loaded)
        replica.unloading = {a: v for a, v in replica.unloading.items() if a not in gone}
        # A failed load is not tried again there: the step leaves that replica out.
        replica.want_adapters = [a for a in replica.want_adapters if a not in failures]
        self._adopt_resolved(replica, loaded)
        replica.adapters, replica.adapter_failures = loaded, failures
        self.put_replica(replica)
        self.changed = True

    def _adopt_resolved(self, replica: Replica, loaded: list[str]) -> None:
        """An engine that loads adapters itself (`adapter_resolver`) holds one it was sent a
        request for: kept as if placed there, and unloaded by the same rules."""
        spec = self.specs.get(replica.model)
        if spec is None or not spec.adapter_resolver:
            return
        for name in loaded:
            adapter = self.adapters.get(name)
            if (
                adapter is None
                or adapter.base != replica.model
                or name in replica.want_adapters
                or name in replica.unloading
            ):
                continue
            replica.want_adapters = [*replica.want_adapters, name]
            self.adapter_resolved[name] = self.adapter_resolved.get(name, 0) + 1
            self.count_adapter_way(replica.id, "resolved")
            self.event(name, f"loaded by the engine of {replica.id} on a first request")

    def take_resolve_failures(self, failures) -> None:
        """A router's report of requests its resolver sends could not be served: {REPLICA@ADAPTER:
        why}. The adapter is not sent to that replica again, and no router resolves it
        anywhere, until it is applied again; its requests wait for the control plane's own
        placement."""
        if not isinstance(failures, dict):
            return
        for endpoint, why in list(failures.items())[:100]:
            replica_id, sep, name = str(endpoint).partition(SLOT_SEP)
            replica = self.replicas.get(replica_id)
            if not sep or replica is None or name not in self.adapters:
                continue
            if name in replica.adapter_failures:
                continue
            why = f"its engine could not load it on a request: {str(why)[:200]}"
            replica.adapter_failures = {**replica.adapter_failures, name: why}
            if name in replica.want_adapters:  # ordered there meanwhile: the one safe stop
                self.unload_adapter(replica, name, why)
            self.event(name, f"failed to load on {replica.id}: {why}")
            self.put_replica(replica)
            self.changed = True

    def _self_sleep_report(self, replica: Replica, state: str) -> str:
        """An engine that sleeps by itself (llama.cpp) and wakes on the next request is Ready
        asleep or awake: the flag is news for operators, not for routing, room or idleness.
        Returns the state to act on."""
        spec = self.specs.get(replica.model)
        if spec is None or spec.engine not in SELF_WAKING or state not in ("Ready", "Asleep"):
            return state
        asleep = state == "Asleep"
        if asleep != replica.engine_asleep:
            replica.engine_asleep = asleep
            self.put_replica(replica)
            self.changed = True
            news = "asleep by itself" if asleep else "woken by a request"
            self.event(replica.model, f"replica {replica.id} {news}")
        return "Ready"

    def _sleep_report(self, replica: Replica, state: str, leader: bool) -> bool:
        """Take what an agent says of an engine the fleet puts to sleep; True when that is all
        there was to it (the report says nothing the fleet acts on, or the fleet acted on it
        here)."""
        sleep_states = (ReplicaState.SLEEPING, ReplicaState.ASLEEP, ReplicaState.WAKING)
        if replica.state not in sleep_states:
            return state in ("Asleep", "Waking")  # an engine catching up with its orders
        if not leader:
            return True
        if replica.state == ReplicaState.SLEEPING and replica.sleep and state == "Asleep":
            # From now on it holds its reserve: what was read of it awake says nothing of it.
            replica.asleep_held = True
            replica.gpu_memory_used_mb = 0
            self.set_replica_state(replica, ReplicaState.ASLEEP, f"asleep at level {replica.sleep}")
            self.sleep_totals[replica.model] = self.sleep_totals.get(replica.model, 0) + 1
        elif replica.state == ReplicaState.WAKING and state == "Ready":
            seconds = self.wall() - replica.woken_at
            self.wake_seconds.observe(seconds)
            self.wake_totals[replica.model] = self.wake_totals.get(replica.model, 0) + 1
            replica.ready_at = self.wall()
            self._swapped_in(replica)
            self.set_replica_state(replica, ReplicaState.READY, f"woken in {seconds:.1f}s")
        return True

    def _note_gone(self, node: Node, reports: dict) -> None:
        """A Failed replica holds its cards' memory until its agent says its process is gone
        (rules/held.py): a failed wake's engine may still be waking, a lost node's engines
        may still run."""
        for replica_id in self.on_node.get(node.name, ()):
            replica = self.replicas[replica_id]
            if replica.state != ReplicaState.FAILED or node.name in replica.gone_from:
                continue
            if engine_gone(replica, node.name, reports.get(replica_id)):
                replica.gone_from = [*replica.gone_from, node.name]
                self.put_replica(replica)
                self.changed = True

    def _forget_stopped(self, node: Node, reports: dict) -> None:
        """A Stopping replica whose agents no longer run it is gone."""
        for replica_id in list(self.on_node.get(node.name, ())):
            replica = self.replicas[replica_id]
            if replica.state != ReplicaState.STOPPING:
                continue
            if replica.id not in reports or reports[replica.id]["state"] == "Stopped":
                self.remove_replica(replica.id)

    def assignments(self, name: str) -> list[dict]:
        """What the agent of `name` must run: one entry per replica slice on that node."""
        self.node(name)
        out = []
        for replica_id in self.on_node.get(name, ()):
            replica = self.replicas[replica_id]
            if replica.state not in RESIDENT or replica.state == ReplicaState.STOPPING:
                continue
            spec = self.specs.get(replica.model) or self.leaving_specs.get(replica.model)
            if spec is None:
                continue
            for rank, piece in enumerate(replica.placement):
                if piece.node != name:
                    continue
                leader = self.nodes.get(replica.placement[0].node)
                out.append(
                    {
                        "sleep": replica.sleep,
                        "adapters": self._adapters_held(replica),
                        "engine": spec.engine,
                        "engine_endpoints": spec.engine_endpoints,
                        "gpu_memory_utilization": f"{replica.memory_share or DEFAULT_SHARE:.2f}",
                        "replica": replica.id,
                        "model": replica.model,
                        "command": spec.command,
                        "env": spec.env,
                        "env_from": spec.env_from,
                        "health_path": spec.health_path,
                        "gpus": piece.gpus,
                        "rank": rank,
                        "nnodes": len(replica.placement),
                        "master_addr": leader.address if leader else "",
                        # Its engine loads adapters itself: the agent reads what it holds.
                        **({"adapter_resolver": True} if spec.adapter_resolver else {}),
                    }
                )
        return out

    def _adapters_held(self, replica: Replica) -> list[dict]:
        """What the engine must hold: what it serves, and what it unloads only once every
        router has dropped the route (a deleted adapter's source no longer matters)."""
        names = [*replica.want_adapters, *replica.unloading]
        return [
            {"name": name, "source": self.adapters[name].source if name in self.adapters else ""}
            for name in names
        ]

    def _swapped_in(self, replica: Replica) -> None:
        """A replica placed on room made for it is Ready: the swap is done."""
        swap = self.swapping.pop(replica.id, None)
        if swap is None:
            return
        model, since = swap
        now = self.wall()
        self.swaps.append((now, model, now - since))
        self.swap_seconds.observe(now - since)
        self.swap_totals[model] = self.swap_totals.get(model, 0) + 1


def parse_node(body) -> Node:
    if not isinstance(body, dict):
        raise BadRequest("node", "expected a JSON object")
    for name in ("name", "address", "fabric"):
        if not isinstance(body.get(name), str) or not body[name]:
            raise BadRequest(name, "required, a non-empty string")
    gpus = body.get("gpus")
    if not isinstance(gpus, list):
        raise BadRequest("gpus", "required, a list")
    parsed = []
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise BadRequest(f"gpus[{i}]", "expected an object")
        index, uuid_, gpu_class = gpu.get("index"), gpu.get("uuid"), gpu.get("gpu_class")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise BadRequest(f"gpus[{i}].index", "a non-negative integer")
        if not isinstance(uuid_, str) or not isinstance(gpu_class, str) or not gpu_class:
            raise BadRequest(f"gpus[{i}]", "uuid and gpu_class are required strings")
        parsed.append(
            GPU(
                index=index,
                uuid=uuid_,
                gpu_class=gpu_class,
                memory_mb=int(gpu.get("memory_mb") or 0),
                healthy=bool(gpu.get("healthy", True)),
                reason=str(gpu.get("reason") or ""),
            )
        )
    if len({g.index for g in parsed}) != len(parsed):
        raise BadRequest("gpus", "two GPUs have the same index")
    labels = body.get("labels") or {}
    if not isinstance(labels, dict):
        raise BadRequest("labels", "a map of strings")
    host_memory = body.get("host_memory_mb", 0)
    if isinstance(host_memory, bool) or not isinstance(host_memory, int) or host_memory < 0:
        raise BadRequest("host_memory_mb", "a non-negative integer (MiB)")
    return Node(
        name=body["name"],
        address=body["address"],
        fabric=body["fabric"],
        gpus=parsed,
        labels={str(k): str(v) for k, v in labels.items()},
        host_memory_mb=host_memory,
    )


def parse_gpu_health(gpus) -> dict[int, tuple[bool, str]]:
    if not isinstance(gpus, list):
        raise BadRequest("gpus", "expected a list of {index, healthy, reason}")
    health = {}
    for i, gpu in enumerate(gpus):
        if (
            not isinstance(gpu, dict)
            or not isinstance(gpu.get("index"), int)
            or not isinstance(gpu.get("healthy"), bool)
        ):
            raise BadRequest(f"gpus[{i}]", "needs index (integer) and healthy (boolean)")
        health[gpu["index"]] = (gpu["healthy"], str(gpu.get("reason") or ""))
    return health
