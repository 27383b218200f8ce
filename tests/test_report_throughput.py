"""``hpc_jabas.report_throughput`` names a rank's GPU type as the Trainer's log does (issue 58: a plain CPU run
without ``--emulate`` printed ``gpu=v100``): a user's script, one process, three short fits: no type named (the
line shows the device, the row's gpu is None), ``gpu_types=v100`` (named), ``emulate`` (the emulated type named)."""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import io
    import json
    import sys

    import torch
    from torch import nn

    import hpc_jabas

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.TensorDataset(x, (x.sum(1) > 0).long())
    got = {}
    for name, kw in (("plain", {}), ("flag", {"gpu_types": ["v100"]}), ("emulate", {"emulate": True})):
        model = nn.Linear(4, 2)
        cfg = hpc_jabas.JobConfig(batch=16, epochs=1, run_dir=f"{sys.argv[1]}/{name}", checkpoint=False, **kw)
        trainer = hpc_jabas.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), data,
                                    nn.CrossEntropyLoss(), config=cfg)
        result = trainer.fit()
        out = io.StringIO()
        rows = hpc_jabas.report_throughput(trainer, result, file=out)
        got[name] = {"rows": rows, "text": out.getvalue()}
    print(json.dumps(got))
''')


def test_report_throughput_names_no_gpu_on_a_cpu_run_without_emulation(tmp_path):
    (tmp_path / "user.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_JABAS_", "SLURM_", "OMPI_", "PMI"))}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HPC_JABAS_BACKEND="torch")
    p = subprocess.run([sys.executable, "user.py", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    plain = got["plain"]
    assert [r["gpu"] for r in plain["rows"]] == [None] and plain["rows"][0]["samples"] == 64, plain
    line = plain["text"].splitlines()[0]
    assert "gpu=" not in plain["text"] and line.split()[:3] == ["rank", "0", "device=cpu"], plain["text"]
    for name in ("flag", "emulate"):
        assert [r["gpu"] for r in got[name]["rows"]] == ["v100"], got[name]
        assert got[name]["text"].splitlines()[0].split()[:3] == ["rank", "0", "gpu=v100"], got[name]["text"]
