"""Every `qdc` command's --help lists its options, then -h/--help last."""
import pytest
from click.testing import CliRunner

from qdc.cli.main import cli


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_help_ends_with_the_help_option(command):
    r = CliRunner().invoke(cli, [command, "--help"])
    assert r.exit_code == 0, r.output
    options = [line.split()[0] for line in r.output.splitlines() if line.startswith("  -")]
    assert options and options[-1] == "-h," and options.count("-h,") == 1, r.output
