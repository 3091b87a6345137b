"""`python -m radixflow ...` is the `radixflow` command line."""

import os
import sys

# Run from a checkout, `python -m` puts the checkout first on sys.path, where its kernels/ folder
# would shadow Hugging Face's `kernels` package, which transformers imports: drop that entry
# (the installed package, editable or not, is found without it).
_here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_here, "pyproject.toml")) and os.path.isfile(
    os.path.join(_here, "kernels", "cpu_build.py")
):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from radixflow.runtime.cli import main  # noqa: E402

sys.exit(main())
