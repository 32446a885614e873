"""replay: device-independent noise, bit-exact updates, fingerprints, rebuild / verify.

Modules: ``noise`` (spec v1 keys and elements), ``update`` (optimizer rules), ``fingerprint``,
``rebuild`` and ``anchors``; ``_reference`` is the plain-torch oracle (and the CUDA path),
``_cpu_kernels`` the numba fast path that must match it bit for bit.
"""
