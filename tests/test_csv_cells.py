"""CSV cells read back as numbers, except names that only look like numbers to int()."""

from hookgraph.runs.files import read_csv


def test_a_slurm_array_job_id_stays_text(tmp_path):
    # Python's int() reads "4242_0" as 42420; the job id of array task 0 of job 4242 is text.
    path = tmp_path / "sweep.csv"
    path.write_text("job_id,loss,steps\n4242_0,0.25,3\n")
    assert read_csv(path) == [{"job_id": "4242_0", "loss": 0.25, "steps": 3}]
