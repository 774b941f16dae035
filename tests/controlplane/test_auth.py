"""Credentials are found by their digest: a map lookup, never a walk of every node's."""

from controlplane.vocabulary.auth import Credentials, digest, identify, new_credential

TOKENS = {"admin": "adm-1", "viewer": "vwr-1"}


class NoWalk(dict):
    """A node -> digest map that fails if anything walks it."""

    def items(self):
        raise AssertionError("identify walked every node's credential")

    def values(self):
        raise AssertionError("identify walked every node's credential")

    def __iter__(self):
        raise AssertionError("identify walked every node's credential")


def credentials_of(count: int) -> tuple[Credentials, dict[str, str]]:
    issued, kept = {}, {}
    for i in range(count):
        issued[f"n{i}"], kept[f"n{i}"] = new_credential()
    return Credentials(kept), issued


def test_a_credential_names_its_node_and_an_unknown_one_nobody():
    credentials, issued = credentials_of(1000)
    credentials.digests = NoWalk(credentials.digests)
    for node in ("n0", "n999", "n500"):
        caller = identify(f"Bearer {issued[node]}", TOKENS, credentials)
        assert caller is not None and caller.node == node and not caller.roles
    assert identify("Bearer gfn_nobody-issued-this", TOKENS, credentials) is None
    assert identify("Bearer adm-1", TOKENS, credentials).roles == {"admin"}
    assert identify("Bearer ", TOKENS, credentials) is None
    assert identify("Basic adm-1", TOKENS, credentials) is None


def test_a_new_credential_replaces_the_old_and_a_revoked_one_names_nobody():
    credentials, issued = credentials_of(3)
    token, kept = new_credential()
    credentials["n1"] = kept
    assert identify(f"Bearer {issued['n1']}", {}, credentials) is None, "the old one is dead"
    assert identify(f"Bearer {token}", {}, credentials).node == "n1"
    assert credentials.pop("n1") == kept and "n1" not in credentials
    assert identify(f"Bearer {token}", {}, credentials) is None
    assert len(credentials) == 2 and credentials.node_of(digest(issued["n2"])) == "n2"
