#!/usr/bin/env bash
# A venv layered over another interpreter's packages:  tools/venv_over.sh PYTHON VENV
#
# The venv sees everything PYTHON's site-packages holds (its torch stack), and what is installed into it
# comes first. It is made with a .pth file that runs site.addsitedir, so the other site's own .pth files
# (setuptools' distutils shim among them) run too: `venv --system-site-packages` would show the *base*
# interpreter's packages where PYTHON is itself a venv's, and a plain path line would skip those .pth files
# (deepspeed 0.19.2 then fails on Python 3.12 with "No module named 'distutils'"). The venv has no pip of its
# own: install into it with  PYTHON -m pip --python VENV/bin/python install ...
set -euo pipefail
python=$1
venv=$2
site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
rm -rf "$venv"
"$python" -m venv --without-pip "$venv"
own=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
echo "import site; site.addsitedir('$site')" > "$own/over-$(basename "$(dirname "$(dirname "$site")")").pth"
echo "$venv/bin/python"
