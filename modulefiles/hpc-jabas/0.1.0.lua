-- hpc-jabas 0.1.0: adaptive batching and heterogeneous-GPU data parallelism on Slurm (Horovod).
-- The repository root is found from this file's own place (<root>/modulefiles/hpc-jabas/0.1.0.lua),
-- so the module works from any clone:  module use <root>/modulefiles && module load hpc-jabas
-- In a non-login shell (a script, `bash -c`, many job shells) `module` exists only after Lmod's init:
--   source /usr/share/lmod/lmod/init/bash      (Debian's path; $LMOD_PKG/init/bash elsewhere)
local fn   = myFileName()
local root = fn:match("^(.*)/[^/]+/[^/]+/[^/]+$") or "."
local venv = pathJoin(root, ".venv")

whatis("Name: hpc-jabas")
whatis("Version: 0.1.0")
whatis("Description: adaptive batch size and heterogeneous-GPU Horovod training on Slurm")
whatis("URL: " .. root)

help([[
hpc-jabas 0.1.0 - adaptive batching and heterogeneous-GPU data parallelism for Slurm clusters.

Puts the hpc-jabas command (]] .. venv .. [[/bin) on PATH and the
package (]] .. root .. [[) on PYTHONPATH; sets HPC_JABAS_ROOT.
Create the environment first:  bash ]] .. root .. [[/scripts/setup.sh
Then:  hpc-jabas --help
]])

if not isDir(venv) then
  LmodMessage("hpc-jabas: " .. venv .. " does not exist yet; run " .. pathJoin(root, "scripts/setup.sh"))
end

setenv("HPC_JABAS_ROOT", root)
prepend_path("PATH", pathJoin(venv, "bin"))
prepend_path("PYTHONPATH", root)
