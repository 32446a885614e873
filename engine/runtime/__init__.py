"""The runtime: what a training session runs. `session` (train, resume, fork) settles a run
in `setup/`, loads its model from `models/`, scores members with `scoring/` replicas on
`backends/` in `pools/`, and runs `loop`, the ledger's one writer; `console/` is the
terminal's side and `loggers/` the trackers'; `hooks`, `failpoints` and `dirs` are small
helpers the rooms share. It imports neither the CLI, the Python API, search nor rebuild,
and each room imports only the rooms tests/test_layout.py lists for it.
"""
