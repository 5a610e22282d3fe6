"""The CURVE allow-list: read again when DIR/allowed changes, so machines are added without a restart."""

from __future__ import annotations

import shutil

import pytest

from flare2.errors import ConfigError
from flare2.wire.security import AllowList, ephemeral_client, load_client, load_server, make_keys


def test_a_key_copied_into_the_allowed_folder_gets_in_without_a_restart_and_a_removed_one_is_refused(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    make_keys(keys, "laptop")
    (keys / "allowed" / "laptop.key").unlink()
    own_agents, server = ephemeral_client(load_server(keys))
    allow = AllowList(server)
    client, laptop = load_client(keys).public_key, load_client(keys, "laptop").public_key
    assert allow.allows(client) and allow.allows(own_agents.public_key) and not allow.allows(laptop)

    shutil.copy(keys / "laptop.key", keys / "allowed" / "laptop.key")
    assert allow.allows(laptop)

    (keys / "allowed" / "client.key").unlink()
    assert not allow.allows(client)
    # The run's own agents do not depend on the folder.
    assert allow.allows(own_agents.public_key)


def test_refusals_are_counted(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    allow = AllowList(load_server(keys))
    for _ in range(3):
        assert not allow.callback("*", b"x" * 40)
    assert allow.refused == 3


def test_a_secret_key_file_holding_only_a_public_key_is_refused_naming_the_file(tmp_path):
    keys = tmp_path / "keys"
    make_keys(keys)
    shutil.copy(keys / "client.key", keys / "client.key_secret")
    with pytest.raises(ConfigError, match=r"client\.key_secret holds no secret key"):
        load_client(keys)


def test_keys_for_a_folder_that_cannot_be_made_end_in_a_message_naming_it(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match=r"cannot make .*a_file/keys/allowed \(Not a directory\): give flare2 keys"):
        make_keys(a_file / "keys")
