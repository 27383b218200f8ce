"""The ranks and what passes between them: how this process was started (``launchers.py``), where the job runs
(``world.py``), the one seam every collective goes through (``seam.py``), which holds one ``Backend``
(``backend.py``: the protocol) of the two classes (``torch_backend.py``'s ``TorchBackend``, its ranks meeting in
``rendezvous.py``; ``horovod_backend.py``'s ``HorovodBackend``: the only module that imports horovod), the gradient
reducers (``reducer.py``; torch's DistributedDataParallel ones in ``ddp.py``), a lost rank (``torch_lost.py``) or a
hung one (``heartbeat.py``), and how an error ends a rank (``exits.py``: one line, exit code 2, on every rank).

Nothing here is imported at package import: ``import hpc_jabas`` stays light (exits.py and launchers.py
import no torch)."""
