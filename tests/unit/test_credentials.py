"""The credential store (``controller.credentials``) and the client side's token loading."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from controller.credentials import (
    DEFAULT_NAMES,
    CredentialError,
    CredentialStore,
    Identity,
    Role,
)
from understudy.wire.credentials import (
    CredentialFileError,
    bearer,
    ca_file_of,
    load_token,
    read_token_file,
)


@pytest.fixture()
def store(tmp_path: Path) -> CredentialStore:
    store = CredentialStore(tmp_path / "credentials")
    store.init()
    return store


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_writes_one_private_token_per_role_and_stores_only_hashes(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path / "credentials")
    written = store.init()
    assert sorted(p.name for p in written) == sorted(f"{r.value}.token" for r in DEFAULT_NAMES)
    assert _mode(store.directory) == 0o700 and _mode(store.path) == 0o600
    raw = store.path.read_text()
    for path in written:
        assert _mode(path) == 0o600
        token = path.read_text().strip()
        assert token not in raw  # the store keeps hashes, never tokens
        role = Role(path.name.removesuffix(".token"))
        assert store.authenticate(token) == Identity(role, role.value)
    assert store.init() == []  # a second init changes nothing
    assert json.loads(store.path.read_text()) == json.loads(raw)


def test_unknown_malformed_and_oversized_tokens_are_no_one(store: CredentialStore) -> None:
    admin = store.token_path("admin").read_text().strip()
    for token in ("", "admin", admin + "x", admin[:-1], "x" * 10_000, "agent.0.s1.00",
                  "agent.x.s1.ab", "agent.0..ab", "agent."):
        assert store.authenticate(token) is None, token


def test_agent_credentials_are_derived_and_name_their_server(store: CredentialStore) -> None:
    path = store.issue_agent("s1")
    token = path.read_text().strip()
    assert _mode(path) == 0o600 and token == store.agent_token("s1")
    assert token.startswith("agent.0.s1.") and token not in store.path.read_text()
    assert store.authenticate(token) == Identity(Role.AGENT, "agent.s1", "s1")
    # Another server's name with s1's MAC is not a credential, nor is a changed MAC.
    assert store.authenticate(token.replace(".s1.", ".s2.")) is None
    assert store.authenticate(token[:-2] + ("00" if token[-2:] != "00" else "11")) is None
    # Server ids with dots are fine (the MAC is the last part).
    dotted = store.agent_token("rack.1.s7")
    assert store.authenticate(dotted) == Identity(Role.AGENT, "agent.rack.1.s7", "rack.1.s7")


def test_rotating_one_agent_voids_only_its_old_credential(store: CredentialStore) -> None:
    old_s1, s2 = store.agent_token("s1"), store.agent_token("s2")
    new_s1 = store.issue_agent("s1", rotate=True).read_text().strip()
    assert new_s1 != old_s1 and new_s1.startswith("agent.1.s1.")
    assert store.authenticate(old_s1) is None
    assert store.authenticate(new_s1) is not None and store.authenticate(s2) is not None


def test_rotating_the_agent_secret_voids_every_agent_credential(store: CredentialStore) -> None:
    old = [store.agent_token(s) for s in ("s1", "s2")]
    store.rotate_agent_secret()
    assert all(store.authenticate(t) is None for t in old)
    assert store.authenticate(store.agent_token("s1")) is not None


def test_rotate_issue_and_revoke_named_credentials(store: CredentialStore) -> None:
    old = store.token_path("read").read_text().strip()
    new = store.rotate("read").read_text().strip()
    assert store.authenticate(old) is None
    assert store.authenticate(new) == Identity(Role.READ, "read")
    grafana = store.issue("grafana", Role.READ).read_text().strip()
    assert store.authenticate(grafana) == Identity(Role.READ, "grafana")
    assert ("grafana", Role.READ) in store.names()
    store.revoke("grafana")
    assert store.authenticate(grafana) is None and not store.token_path("grafana").exists()
    with pytest.raises(CredentialError):
        store.rotate("nobody")
    with pytest.raises(CredentialError):
        store.issue("a1", Role.AGENT)
    with pytest.raises(ValueError):
        store.issue("../escape", Role.READ)


def test_a_running_store_sees_changes_made_by_another(store: CredentialStore) -> None:
    """What ``understudy credentials rotate`` does reaches a controller without a restart."""
    other = CredentialStore(store.directory)
    admin = store.token_path("admin").read_text().strip()
    assert store.authenticate(admin) is not None
    other.rotate("admin")
    assert store.authenticate(admin) is None


def test_no_store_refuses_with_a_message_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="credentials init"):
        CredentialStore(tmp_path / "none").authenticate("admin.x")


def test_token_loading_precedence_and_file_checks(tmp_path: Path) -> None:
    file = tmp_path / "t.token"
    file.write_text("from-file\n")
    file.chmod(0o600)
    other = tmp_path / "u.token"
    other.write_text("from-env-file\n")
    other.chmod(0o600)
    env = {"UNDERSTUDY_TOKEN_FILE": str(other), "UNDERSTUDY_TOKEN": "from-env"}
    assert load_token(file, env) == "from-file"
    assert load_token(None, env) == "from-env-file"
    assert load_token(None, {"UNDERSTUDY_TOKEN": "from-env"}) == "from-env"
    assert load_token(None, {}) is None
    assert bearer("t") == {"Authorization": "Bearer t"} and bearer(None) == {}
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(CredentialFileError, match="empty"):
        read_token_file(tmp_path / "empty")
    with pytest.raises(CredentialFileError, match="cannot read"):
        read_token_file(tmp_path / "missing")
    file.chmod(0o644)  # others may read it: no longer a secret
    with pytest.raises(CredentialFileError, match="chmod 600"):
        read_token_file(file)
    assert ca_file_of(None, {"UNDERSTUDY_CA_FILE": "/x/ca.pem"}) == Path("/x/ca.pem")
    assert ca_file_of(Path("/y"), {"UNDERSTUDY_CA_FILE": "/x/ca.pem"}) == Path("/y")
