"""The README is an executable contract: every bash and python block of README.md and of the documents it points
to for details (tests/support/documents.py: slurm/local/README.md, examples/README.md, docs/simulator.md, ...)
runs, in order, in ONE bash session, in a fresh copy of the repository on a path every node of the local Slurm
cluster sees (the fixture starts the cluster). A block marked ``<!-- readme-test: skip (why) -->`` right before
its fence is the only kind that does not run. Each block's runtime is printed (``pytest -s``) and written to
runs/readme-test.json (the output to runs/readme-test.log).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from support.documents import ALWAYS, DATA, ELSEWHERE, PYTHON, SHELL, Block, all_blocks, blocks, executed

ROOT = Path(__file__).resolve().parents[1]
#: variables of this test process that a new user's shell would not have
_DROP = ("SLURM_", "HPC_JABAS", "OMPI_", "PMIX_", "HOROVOD_", "LMOD", "MODULE", "_ModuleTable", "__LMOD", "PYTEST",
         "VIRTUAL_ENV", "PYTHONPATH", "LOADEDMODULES", "_LMFILES_")


def test_every_block_has_a_language_and_runs_or_says_why_not():
    bs = all_blocks()
    unlabelled = [b.name for b in bs if b.lang not in SHELL + PYTHON + DATA]
    assert not unlabelled, f"blocks without a known language (bash/python/toml/text): {unlabelled}"
    run = [b for b in bs if b.runs]
    skipped = [b for b in bs if b.skip is not None]
    assert len(run) >= 12 and sum(b.lang in PYTHON for b in run) >= 2, [b.name for b in run]
    assert all(b.skip and b.skip != "marked" for b in skipped), "every skip marker gives its reason"
    per_doc = Counter(b.doc for b in skipped)
    assert max(per_doc.values(), default=0) <= 2, [(b.name, b.skip) for b in skipped]
    # what moved out of the README still runs: the walk-throughs and the simulation, each with its blocks
    for doc, least in (("README.md", 10), ("examples/README.md", 3), ("docs/simulator.md", 1)):
        assert sum(b.runs for b in blocks(doc)) >= least, doc


def test_the_documents_run_in_order_and_each_once():
    docs = executed()
    assert docs[0] == "README.md" and list(docs[:len(ALWAYS)]) == list(ALWAYS) and len(set(docs)) == len(docs)
    assert all((ROOT / d).is_file() for d in docs), docs
    names = [b.name for b in all_blocks()]
    assert len(names) == len(set(names))
    # a linked document whose blocks run elsewhere names a test that exists and reads it
    for doc, test in ELSEWHERE.items():
        assert doc not in docs
        if (ROOT / doc).is_file():
            assert (ROOT / test).is_file() and doc in (ROOT / test).read_text().replace('" / "', "/"), (doc, test)


def test_the_readme_is_a_front_door():
    """At most 300 lines; the details live in the documents it links, and each of them exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    linked = set(re.findall(r"\]\(((?:docs|examples|bench|slurm)/[\w./-]+\.md)(?:#[\w-]+)?\)", text))
    assert {"docs/toolchain.md", "docs/config.md", "docs/adaptive.md", "docs/simulator.md",
            "examples/README.md", "bench/RESULTS.md"} <= linked, sorted(linked)


def test_a_skip_marker_counts_only_right_before_its_fence(tmp_path):
    (tmp_path / "doc.txt").write_text("<!-- readme-test: skip (why not) -->\n```bash\necho 1\n```\n\n"
                                   "<!-- readme-test: skip (too far) -->\ntext between\n```python\nprint(2)\n```\n"
                                   "```toml\na = 1\n```\n")
    got = [(b.lang, b.skip, b.runs, b.line) for b in blocks("doc.txt", tmp_path)]
    assert got == [("bash", "why not", False, 2), ("python", None, True, 8), ("toml", None, False, 11)]


def test_readme_sources_lmod_init_before_module_use():
    text = "".join(b.text for b in all_blocks() if b.skip is None and b.lang in SHELL)
    init = text.find("source /usr/share/lmod/lmod/init/bash")
    assert 0 <= init < text.find("module use") < text.find("module load hpc-jabas"), "Lmod init first"
    cmds = [ln.split("#")[0] for ln in text.splitlines()]
    profile = next(c for c in cmds if c.strip().startswith("hpc-jabas profile"))
    assert "--model " in profile and "--out " in profile


def test_readme_runs_of_the_same_script_use_distinct_run_dirs():
    text = "".join(b.text for b in all_blocks() if b.skip is None and b.lang in SHELL)
    cmds = text.replace("\\\n", " ").splitlines()
    launches = [c for c in cmds if c.strip().startswith(("mpirun ", "horovodrun "))]
    dirs = [re.search(r"--run-dir (\S+)", x) for x in launches]
    assert len(launches) >= 2 and all(dirs), launches
    assert len({d.group(1) for d in dirs if d}) == len(launches), launches


def _script(bs: list[Block], work: Path, times: Path) -> str:
    out = ["set -eo pipefail", f"exec 3>>{times}", "hj_t() { printf '%s %s\\n' \"$1\" \"$(date +%s.%N)\" >&3; }"]
    for i, b in enumerate(bs):
        out.append(f"hj_t 'begin {i}'")
        if b.lang in PYTHON:
            f = work / f".readme-block-{i}.py"
            f.write_text(b.text)
            out.append(f"python {f.name}")
        else:
            out.append(b.text.rstrip("\n"))
        out.append(f"hj_t 'end {i}'")
    return "\n".join(out) + "\n"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP)}
    env["PATH"] = ":".join(p for p in os.environ.get("PATH", "").split(":") if ".venv" not in p)
    return env


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file() and not f.startswith(("runs/", ".readme-block")):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    # a git repository of its own, so the test can say that the blocks wrote only git-ignored paths
    git = ["git", "-c", "user.name=readme-test", "-c", "user.email=readme-test@localhost"]
    subprocess.run(git + ["init", "-q"], cwd=dest, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dest, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "copy"], cwd=dest, check=True)


def _cancel_leftovers(cluster, work: Path) -> None:
    ids = set()
    for p in (work / "runs").glob("**/chain.jsonl"):
        for ln in p.read_text().splitlines():
            try:
                e = json.loads(ln)
            except ValueError:
                continue
            ids |= {str(e[k]) for k in ("job_id", "to_job") if str(e.get(k, "")).isdigit()}
    if ids:
        cluster.cancel(*sorted(ids))


@pytest.mark.slurm
@pytest.mark.mpi
@pytest.mark.timeout(900)
def test_readme_blocks_run_in_order(slurm_cluster, slurm_tmp):
    work = slurm_tmp / "repo"
    work.mkdir()
    _copy_repo(work)
    bs = [b for b in all_blocks() if b.runs]
    times = slurm_tmp / "times.txt"
    script = slurm_tmp / "readme.sh"
    script.write_text(_script(bs, work, times))
    log = slurm_tmp / "readme.log"
    t0 = time.time()
    try:
        with open(log, "w") as f:
            r = subprocess.run(["bash", "--noprofile", "--norc", str(script)], cwd=work, env=_env(), stdout=f,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=840)
    finally:
        _cancel_leftovers(slurm_cluster, work)
    marks: dict[str, float] = {}
    for ln in times.read_text().splitlines():
        what, t = ln.rsplit(" ", 1)
        marks[what] = float(t)
    rows = [{"block": b.name, "lang": b.lang, "first_line": b.text.strip().splitlines()[0][:70],
             "seconds": round(marks[f"end {i}"] - marks[f"begin {i}"], 1) if f"end {i}" in marks else None}
            for i, b in enumerate(bs)]
    (ROOT / "runs").mkdir(exist_ok=True)
    shutil.copy(log, ROOT / "runs" / "readme-test.log")
    (ROOT / "runs" / "readme-test.json").write_text(json.dumps({"total_s": time.time() - t0, "blocks": rows},
                                                               indent=1))
    print(f"\nREADME blocks ({time.time() - t0:.0f} s in all):")
    for row in rows:
        print(f"  {row['block']:<28} {row['seconds'] if row['seconds'] is not None else '-':>6} s  {row['first_line']}")
    failed = next((i for i in range(len(bs)) if f"end {i}" not in marks), None)
    out = log.read_text()
    assert r.returncode == 0 and failed is None, (
        f"README block {bs[failed].name if failed is not None else '?'} failed (exit {r.returncode}):\n"
        f"{bs[failed].text if failed is not None else ''}\n--- output (tail) ---\n{out[-6000:]}")
    # what the blocks promise, checked on what they left behind
    assert "already finished at epoch 2 of 2; --epochs 3 (or more) to go on" in out, out[-3000:]
    assert "chain finished: last job" in out
    for chain in ("digits-chain", "digits-mix-chain"):
        outs = list((work / "runs" / chain / "jobs").glob("sbatch-*.out"))
        assert outs, f"no job output under runs/{chain}/jobs"
    assert not list(work.glob("*.out")), "job output files in the submit directory"
    # the ResNet block (3 ranks, a DataLoader with 2 workers each): 400 JPEG files, 2 epochs of 4 iterations of
    # 96 and a 16-sample tail; the loader's lookahead is 2 workers x 2 prefetched; the standard ResNet-18 layout
    import torch  # noqa: F401  (the example's model)
    sys.path.insert(0, str(ROOT))
    from examples.train_resnet import resnet18
    res = json.loads((work / "runs" / "resnet-jpeg" / "summary.json").read_text())
    assert res["samples"] == 800 and res["iterations"] == 10 and res["epoch"] == 2 and res["decision_lead"] == 4, res
    assert res["parameters"] == sum(p.numel() for p in resnet18(10, 16).parameters()), res
    its = [json.loads(ln) for ln in (work / "runs" / "resnet-jpeg" / "metrics.jsonl").read_text().splitlines()]
    its = [m for m in its if m["type"] == "iteration"]
    assert [m["samples"] for m in its] == [96, 96, 96, 96, 16] * 2 and all(0.0 < m["loss"] < 10.0 for m in its)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=work, capture_output=True, text=True).stdout
    assert dirty == "", f"README blocks wrote outside git-ignored paths:\n{dirty}"
