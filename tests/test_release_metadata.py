"""What JupyterLab compares when it opens the released notebook (pure reads of generated files)."""

import json

import pytest
from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict
from mlbook_tools.config import layout

pytestmark = pytest.mark.unit


def test_the_released_notebook_names_the_kernel_as_the_kernel_names_itself():
    """A kernelspec display name other than the kernel's own ("Python 3" vs "Python 3 (ipykernel)")
    makes JupyterLab mark the notebook modified the moment it opens."""
    L = layout()
    for path in [*L.release.glob("*.ipynb"), *L.course.glob("source/*/*.ipynb")]:
        spec = json.loads(path.read_text())["metadata"]["kernelspec"]
        assert spec["name"] == KERNEL_NAME, path
        assert spec["display_name"] == get_kernel_dict()["display_name"], (path, spec)
