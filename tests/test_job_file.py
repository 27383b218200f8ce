"""A job file given to the job's launcher (python -m hpc_jabas.runtime.job.launch JOB.toml): a [job] value of the
wrong type is one line and exit 2, the same check (core/jobspec.check_job_table) as hpc-jabas submit's."""
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_jabas.errors import ConfigError
from hpc_jabas.runtime.job.launch import spec_from_file

ROOT = Path(__file__).resolve().parents[1]


def job_file(d: Path, body: str) -> Path:
    p = d / "job.toml"
    p.write_text(body + "\n[train]\nepochs = 1\n")
    return p


@pytest.mark.parametrize("body,say", [
    ('[job]\ntask = "m:build"\nchain_dir = 42', "[job] chain_dir = 42 in"),
    ('[job]\ntask = 3\nchain_dir = "c"', "[job] task = 3 in"),
    ('[job]\ntask = "m:build"\nchain_dir = "c"\nmethod = ["sbatch"]', "[job] method = ['sbatch']"),
    ('[job]\ntask = "m:build"\nchain_dir = "c"\npythonpath = [1]', "[job] pythonpath = [1]"),
    ('[job]\ntask = "m:build"\nchain_dir = "c"\nmix = 3', "[job] mix = 3"),
    ('[job]\ntask = "m:build"\nchain_dir = "c"\nepochs = 3', "unknown [job] key 'epochs'"),
    ('job = 5', "job = 5 in"),
    ('[job]\nchain_dir = "c"', "needs a [job] table"),
], ids=["chain-dir-int", "task-int", "method-list", "pythonpath-ints", "mix-int", "unknown-key", "job-not-table",
        "no-task"])
def test_a_bad_job_table_is_one_config_error_line(tmp_path, body, say):
    with pytest.raises(ConfigError) as e:
        spec_from_file(str(job_file(tmp_path, body)))
    assert say in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_pythonpath_string_is_one_directory(tmp_path):
    body = f'[job]\ntask = "m:build"\nchain_dir = "c"\npythonpath = "{tmp_path}"'
    spec = spec_from_file(str(job_file(tmp_path, body)))
    assert spec.pythonpath == [str(tmp_path)]


@pytest.mark.parametrize("after_failure", [False, True], ids=["job", "after-failure"])
def test_the_launcher_says_one_line_and_exits_2(tmp_path, after_failure):
    p = job_file(tmp_path, '[job]\ntask = "m:build"\nchain_dir = 42')
    argv = ["--after-failure", "1", str(p)] if after_failure else [str(p)]
    out = subprocess.run([sys.executable, "-m", "hpc_jabas.runtime.job.launch", *argv], capture_output=True, text=True,
                         timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
                                           "SLURM_JOB_ID": "5"})
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "[job] chain_dir = 42" in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout
