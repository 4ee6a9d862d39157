"""The ``crowdgrad`` entry point: version, help, the local trainer, bad arguments."""

import subprocess
import sys

import pytest

from crowdgrad import __version__
from crowdgrad.cli import COMMANDS, build_parser, command_of, main
from nn.modelfile import load_model


def test_version_and_help_run_in_a_real_process():
    out = subprocess.run(
        [sys.executable, "-m", "crowdgrad", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"crowdgrad {__version__}"
    out = subprocess.run(
        [sys.executable, "-m", "crowdgrad", "--help"], capture_output=True, text=True, check=True
    )
    for name in COMMANDS:
        assert name in out.stdout


def test_every_command_module_registers_a_runnable_parser():
    parser = build_parser()
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([name, "--help"])
        assert exc.value.code == 0


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["client", "ws://x/ws", "--cpu-share", "0.5"], "client"),
        (["--threads", "2", "-vv", "client", "ws://x/ws"], "client"),
        (["coordinator", "--port", "0"], "coordinator"),
        (["client", "--help"], "client"),
        (["--help"], None),
        ([], None),
        (["clinet"], None),
        (["--version", "client"], None),
        (["--threads"], None),
    ],
)
def test_command_of_names_the_subcommand_or_none(argv, command):
    assert command_of(argv) == command


def test_a_client_command_line_loads_no_other_command():
    """``crowdgrad client`` starts without the coordinator's web stack or the simulator."""
    code = (
        "import sys; from crowdgrad.cli import build_parser, command_of;"
        "build_parser(command_of(['client', 'ws://x/ws'])).parse_args(['client', 'ws://x/ws']);"
        "print(sorted(m for m in ('fastapi', 'coordinator.http.server', 'simulations') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_coordinator_listens_before_it_imports_its_server():
    """``crowdgrad coordinator`` binds before numba, FastAPI and the core load (most
    of a second of CPU): a client that starts beside it waits in the backlog."""
    code = (
        "import importlib, socket, sys\n"
        "from crowdgrad.cli import build_parser\n"
        "args = build_parser('coordinator').parse_args(['coordinator', '--port', '0'])\n"
        "heavy = ('numpy', 'numba', 'fastapi',\n"
        "         'coordinator.core.machine', 'coordinator.http.server')\n"
        "print(sorted(m for m in heavy[1:] if m in sys.modules))\n"
        "real, seen = importlib.import_module, []\n"
        "def spy(name, *rest):\n"
        "    if name == 'coordinator.http.server':\n"
        "        port = args.listening.getsockname()[1]\n"
        "        socket.create_connection(('127.0.0.1', port), timeout=5).close()\n"
        "        seen.append(name)\n"
        "    return real(name, *rest)\n"
        "importlib.import_module = spy\n"
        "args.early(args)\n"
        "print(seen, all(m in sys.modules for m in heavy))\n"
        "args.listening.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "['coordinator.http.server'] True"], out.stdout


def test_importing_the_cli_does_not_import_numpy():
    """So ``main`` can tell OpenBLAS its thread count before numpy loads it."""
    code = "import sys, crowdgrad.cli; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("argv", "env", "threads"),
    [
        (["client", "ws://x/ws"], None, 1),
        (["--threads", "3", "client", "ws://x/ws"], "2", 3),
        (["client", "ws://x/ws"], "2", 2),
        (["--threads", "x", "client"], None, 1),  # the parser says what is wrong, later
        (["client"], "many", 1),
    ],
)
def test_threads_of_reads_the_thread_count_before_any_import(argv, env, threads, monkeypatch):
    from crowdgrad.cli import threads_of

    if env is None:
        monkeypatch.delenv("CROWDGRAD_THREADS", raising=False)
    else:
        monkeypatch.setenv("CROWDGRAD_THREADS", env)
    assert threads_of(argv) == threads


def test_train_digits_saves_a_model_that_loads(tmp_path, capsys):
    out = tmp_path / "m.npz"
    rc = main(["train", "--widths", "64,32,10", "--steps", "300", "--save", str(out)])
    assert rc == 0
    params, _, _ = load_model(out)
    assert params.spec.widths == (64, 32, 10)
    assert "accuracy" in capsys.readouterr().out.lower()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["train", "--steps", "0"], "--steps"),
        (["train", "--batch", "-3"], "--batch"),
        (["train", "--widths", "64,x,10"], "widths"),
        (["train", "--widths", "65,10"], "65"),
        (["--threads", "0", "train"], "threads"),
    ],
)
def test_bad_arguments_exit_2_naming_the_argument(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error" in err and needle in err


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_bad_port_is_a_usage_error(port, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["coordinator", "--port", port])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --port: must be a whole number from 0 to 65535 (0: any free one), got '{port}'"
        in err
    )


def test_a_port_in_use_says_what_to_do(capsys):
    import signal
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = signal.getsignal(signal.SIGTERM)
        assert main(["coordinator", "--port", str(port)]) == 2
        assert signal.getsignal(signal.SIGTERM) is before  # its stop handlers restored
    err = capsys.readouterr().err
    assert f"cannot bind 127.0.0.1:{port}" in err and "choose another --port" in err


def test_a_store_the_coordinator_cannot_write_is_refused_before_the_banner(
    tmp_path, capsys, monkeypatch
):
    def fails(store, needle):
        assert main(["coordinator", "--port", "0", "--store", str(store)]) == 2
        out = capsys.readouterr()
        assert "join with" not in out.out
        assert out.err.startswith("crowdgrad coordinator: error: --store: ")
        assert needle in out.err

    fails(tmp_path / "nodir" / "run.db", f"directory {tmp_path / 'nodir'} does not exist")
    fails(tmp_path, "is a directory; give a file name")
    store = tmp_path / "run.db"
    store.write_bytes(b"")
    import os

    real = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == str(store) else real(p, mode)
    )
    fails(store, f"{store} is not writable, and the coordinator writes its checkpoints there")
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode)
    )
    fails(tmp_path / "new.db", f"directory {tmp_path} is not writable")


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--upstream-every-versions", "0", "--upstream-every-versions: expected >= 1, got 0"),
        ("--upstream-every-s", "nan", "--upstream-every-s: expected a positive number, got nan"),
        ("--upstream-every-s", "-1", "--upstream-every-s: expected a positive number, got -1"),
    ],
)
def test_an_edge_with_a_bad_sync_period_is_refused_before_the_banner(capsys, flag, value, needle):
    argv = ["coordinator", "--port", "0", "--upstream", "ws://127.0.0.1:9/ws", flag, value]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "join with" not in out.out
    assert needle in out.err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--admin-token", " "], "--admin-token (or CROWDGRAD_ADMIN_TOKEN) is blank"),
        (["--admin-token", " t"], "begins or ends with whitespace"),
        (["--join-token", "\t"], "--join-token (or CROWDGRAD_JOIN_TOKEN) is blank"),
    ],
)
def test_a_token_no_one_could_send_is_a_usage_error(argv, needle, capsys):
    """Issue 34: a blank --admin-token enabled an API no token could open."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    assert main(["coordinator", "--port", "0", *argv]) == 2
    out = capsys.readouterr()
    assert needle in out.err and "join with" not in out.out
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handlers are gone
