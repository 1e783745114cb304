"""A sweep under torchrun is refused before any rank starts its own sweep, and a torchrun
variable that is not a number is one line naming it. Each runs the command line in this process
(run_cli_here) with torchrun's variables set: what is checked is the message, the exit code and
the folder not made, which a subprocess would only make slower."""

from tests.cli_helpers import run_cli_here


def test_multirun_under_torchrun_is_refused(tmp_path):
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    proc = run_cli_here(["-m", "runner.steps=1,2", f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert "-m/--multirun under torchrun is not supported" in proc.stderr
    assert not (tmp_path / "sweep").exists()


def test_a_world_size_that_is_not_a_number_is_one_line_naming_it(tmp_path):
    # The check for a sweep under torchrun read WORLD_SIZE with int(): a bare ValueError traceback.
    proc = run_cli_here(["-m", "runner.steps=1,2", f"hydra.sweep.dir={tmp_path}/sweep"], cwd=tmp_path,
                        env={"WORLD_SIZE": "two"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "hookgraph: error: WORLD_SIZE: the environment variable must be an integer" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "sweep").exists()
