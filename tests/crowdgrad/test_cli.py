"""The ``crowdgrad`` entry point: version, help, the local trainer, bad arguments."""

import subprocess
import sys

import pytest

from crowdgrad import __version__
from crowdgrad.cli import COMMANDS, build_parser, main
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
