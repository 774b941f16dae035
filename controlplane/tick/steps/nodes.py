"""Heartbeats and node timeouts: what a lost or deleted node does to its replicas, and the
records of failed replicas kept long enough.

| the node                                   | its replicas                                  |
|--------------------------------------------|-----------------------------------------------|
| heard from within the node timeout (paced  | nothing                                       |
| by the fleet's size, controlplane/pacing)  |                                               |
| silent past the timeout                    | NotReady; each replica that was running fails  |
|                                            | as lost with it (its model places another)   |
| NotReady, a replica Stopping               | forgotten: nothing will report it stopped     |
| deleted by an operator                     | each replica fails (Stopping ones forgotten)  |
| back (its agent heartbeats again)          | a lost replica its agent still runs returns   |
|                                            | as its agent reports it (Fleet's heartbeat);  |
|                                            | its model's count then keeps or stops it      |

A lost replica is not stopped by its agent on the node's return: routers that could still
reach the node may be streaming from it, so only the safe stop may end it. A Failed replica is
forgotten after `failed_retention_s`, once its agent has said its process is gone: until then
it holds its cards' memory (controlplane/rules/held.py).
"""

from __future__ import annotations

from controlplane.rules.held import holds_memory
from controlplane.rules.view import PRESENT, FleetView
from controlplane.vocabulary.actions import Fail, Forget, NodeLost, Stop
from controlplane.vocabulary.model import ReplicaState

GONE_WITH_NODE = {ReplicaState.STOPPING}
LOST_WITH_NODE = PRESENT | {ReplicaState.RETIRING}


def node_timeouts(view: FleetView) -> list:
    actions: list = []
    pacing, count = view.settings.pacing, len(view.nodes)
    for node in view.nodes.values():
        silent = view.clock - node.last_heartbeat
        lost_now = node.ready and silent > pacing.timeout(count, node.heartbeat_s)
        if lost_now:
            actions.append(NodeLost(node.name, silent))
        elif node.ready:
            continue
        # Its own replicas only: a rack gone NotReady must not cost (nodes x replicas).
        why = f"node {node.name} is NotReady (no heartbeat for {silent:.0f}s)"
        actions += _lost(view.replicas_on(node.name), why)
    for name in view.on_node:
        if name not in view.nodes:
            actions += _lost(view.replicas_on(name), f"node {name} deleted", lost=False)
    return actions


def _lost(replicas, why: str, lost: bool = True) -> list:
    """`lost`: the node may come back with them; a deleted one will not, and what was on its
    way out there is simply gone."""
    gone = GONE_WITH_NODE if lost else GONE_WITH_NODE | {ReplicaState.RETIRING}
    actions: list = []
    for replica in replicas:
        if replica.state in gone:
            actions.append(Forget(replica.id))
        elif replica.state in LOST_WITH_NODE:
            actions.append(Fail(replica.id, why, lost=lost))
    return actions


def expired_failures(view: FleetView) -> list:
    keep = view.settings.failed_retention_s
    return [
        Forget(r.id)
        for r in view.replicas.values()
        if r.state == ReplicaState.FAILED
        and view.now - r.updated_at > keep
        and not _engine_may_run(view, r)
    ]


def _engine_may_run(view: FleetView, replica) -> bool:
    """Whether a Failed replica's process may still hold memory on a node the fleet could
    place on: its record stays until that node's agent says it is gone (rules/held.py)."""
    return any(
        holds_memory(replica, piece.node) and piece.node in view.nodes
        for piece in replica.placement
    )


def orphans(view: FleetView) -> list:
    """Replicas of deleted models: they stop (through the safe stop, so that their streams end
    first); their failed records go, but for those lost with a node, which may come back with
    it and be stopped then."""
    actions: list = []
    for replica in view.replicas.values():
        if replica.model in view.specs:
            continue
        if replica.state in PRESENT:
            actions.append(Stop(replica.id, "model deleted"))
        elif (
            replica.state == ReplicaState.FAILED
            and not replica.lost
            and not _engine_may_run(view, replica)
        ):
            actions.append(Forget(replica.id))  # a lost one may come back with its node
    return actions
