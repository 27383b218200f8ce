"""train_worker.py's cases with Horovod made unimportable (``import horovod`` raises ImportError): the torch
backend's whole path, chosen by backend = "auto", must run without it. Each rank adds to its result of the
last case the horovod modules loaded (``horovod_modules``) and how the ranks met (``controller``)."""
import json
import runpy
import sys
from pathlib import Path

sys.modules["horovod"] = None          # type: ignore[assignment]   # import horovod -> ImportError

spec_path = sys.argv[1]
runpy.run_path(str(Path(__file__).with_name("train_worker.py")), run_name="__main__")

from hpc_jabas.runtime.comm import seam as comm  # noqa: E402

spec = json.loads(Path(spec_path).read_text())
last = Path((spec.get("cases") or [spec])[-1]["out_dir"]) / f"rank{comm.rank()}.json"
res = json.loads(last.read_text())
res["horovod_modules"] = sorted(k for k, v in sys.modules.items() if k.split(".")[0] == "horovod" and v is not None)
res["controller"] = comm.controller()
last.write_text(json.dumps(res))
