"""Config plumbing, the bottom of the pure core: the job's configuration (``sections.py``: ``JobConfig``, one field
per key with its section as metadata), the field declaration and the section views (``schema.py``), every choice
and default value (``defaults.py``), the command line (``cliargs.py``), the one set of number checks
(``validate.py``), the text-file and JSON-lines readers, the ``module:callable`` loader, what a chain's job runs
(``jobspec.py``), the GPU catalog (``gpus.py``) and the emulated slowdown specs.

Imports nothing of core/ outside this package."""
