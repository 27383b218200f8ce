"""Emulated ranks with an unannounced slowdown; rank r writes rank<r>.json with the job's calibration."""
import json
import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference import make_data, make_model, make_optimizer  # noqa: E402

from hpc_jabas.core.config.sections import JobConfig  # noqa: E402
from hpc_jabas.core.perf.calibration import RankCalibration  # noqa: E402
from hpc_jabas.runtime.trainer import Trainer  # noqa: E402

# every sample the rank's fit sees (profile time x of n calls, measured y), to compare the fit with
SAMPLES: list[list[float]] = []
_update = RankCalibration.update


def _recording_update(self, x, n, y):
    SAMPLES.append([float(x), int(n), float(y)])
    return _update(self, x, n, y)


spec = json.loads(Path(sys.argv[1]).read_text())
cfg = JobConfig(planner="lbbsp", micro_batch=4, batch=spec.get("batch", 96), run_dir=spec["run_dir"],
                emulate=True, gpu_types=spec["gpu_types"], epochs=1000, metrics_period=10, calibrate=True,
                emulate_base_s=spec.get("base_s", 0.004), emulate_per_sample_s=spec.get("per_sample_s", 0.0005))
cfg.slowdown = {int(r): v for r, v in spec.get("slowdown", {}).items()}
cfg.validate()
model = make_model()
tr = Trainer(model, make_optimizer("momentum", model.parameters(), 0.01), make_data(4096), nn.CrossEntropyLoss(),
             config=cfg)
out = {"rank": tr.rank}
RankCalibration.update = _recording_update     # this run only: the script may run on a warm rank pool
try:
    if spec.get("mode") == "resume_only":          # resume, nothing trained: the calibration as loaded
        out["resumed"] = tr.maybe_resume()
    else:
        tr.fit(max_iterations=spec["steps"], resume=spec.get("resume", False))
        tr.save_checkpoint()
finally:
    RankCalibration.update = _update
out["calibration"] = tr.calib.state_dict()
out["samples"] = SAMPLES
out["view_v100_t4"] = tr.perf_model().profile(tr.gpu_types[0]).time(4)
(Path(spec["out_dir"]) / f"rank{tr.rank}.json").write_text(json.dumps(out))
