"""The ``stream-dp`` command line and its apps (``produce``, ``watch``, ``merge``, ``status``)
without Kafka.

Their Kafka paths (a missing topic, the README's commands) run against a real broker in
tests/integration/test_apps_kafka.py and tests/integration/test_readme_kafka.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stream_dp.cli import COMMANDS, build_parser


def test_the_top_level_help_imports_no_command():
    """``stream-dp --help`` lists the commands without importing any of their modules: no
    NumPy, pydantic, numba, river, SciPy or Kafka client (their import is seconds of CPU)."""
    probe = (
        "import sys\n"
        "from stream_dp.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('numpy', 'pydantic', 'numba', 'river', 'scipy', 'kafka', 'connectors')\n"
        "print('\\n' + __import__('json').dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out.splitlines()[-1]) == []
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize(
    ("command", "defaults"),
    [
        ("produce", ["(default: records)", "(default: bank)", "(default: 0, none)"]),
        ("watch", ["(default: releases)", "(default: 10.0)", "(default: 1)"]),
        ("merge", ["(default: releases)", "(default: 1.0)", "(default: <topic>.merged)"]),
        ("status", ["(default: a table)"]),
    ],
)
def test_each_app_has_a_description_and_shows_its_defaults(command, defaults, capsys):
    module = __import__(COMMANDS[command][0], fromlist=["_"])
    with pytest.raises(SystemExit) as done:
        build_parser(command).parse_args([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    first_line = module.__doc__.splitlines()[0]
    assert first_line.startswith(f"stream-dp {command}: ") and first_line in text
    assert "Exit codes" in text
    for default in defaults:
        assert default in " ".join(text.split()), (command, default)


@pytest.mark.parametrize("command", ["produce", "watch", "merge"])
def test_a_client_that_is_not_installed_is_one_line_and_exit_code_2(command, capsys, monkeypatch):
    import connectors.clients
    from stream_dp.cli import main

    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    monkeypatch.setattr(connectors.clients, "_CLIENTS", {})
    argv = [command, "--client", "confluent-kafka", "--bootstrap", "127.0.0.1:1"]
    if command == "merge":
        argv += ["--model", "m"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--client" in err and "stream-dp[confluent]" in err
