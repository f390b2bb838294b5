"""The untrusted side of the trust boundary: the only files that enter the sandbox.

``runner.py`` (the sandboxed IPython shell that runs a student's cells and calls), ``protocol.py``
(the one wire format, shared with the driver) and ``codec.py`` (its values, both ways) are bound
read-only into every sandbox, next to each other, as ``/sandbox/<name>`` (``confine.INSIDE``).
Inside they are plain scripts: they import the standard library, torch, IPython, the student
library and each other, never the rest of ``mlbook_tools`` (an import-linter contract in
pyproject.toml checks it). This file is not bound into the sandbox.
"""
