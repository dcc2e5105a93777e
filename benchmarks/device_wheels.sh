#!/usr/bin/env bash
# The wheels a device call carries (.whl/, ignored through .git/info/exclude): what the project needs beyond the
# device image's torch, triton, transformers, numpy, safetensors and tokenizers, for Python 3.12 on x86-64, pinned
# to the versions the CPU constraints test, plus the reference engine (spinf-serve 0.1.1) and pydantic, which its
# service imports (the device image has none), for the side-by-side runs.
# In the device call: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#   --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >> .git/info/exclude; }
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 \
    manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_24_x86_64; do platforms+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    -d .whl \
    aiofiles==25.1.0 anyio==4.16.0 attrs==26.1.0 av==18.1.0 blinker==1.9.0 click==8.5.1 einops==0.8.2 \
    fla-core==0.6.0 Flask==3.1.3 h11==0.16.0 h2==4.4.1 hpack==4.2.0 httpcore==1.0.9 httpx==0.29.0 \
    Hypercorn==0.18.0 hyperframe==6.1.0 itsdangerous==2.2.0 Jinja2==3.1.6 MarkupSafe==3.0.4 outcome==1.3.0.post0 \
    priority==2.0.0 prometheus_client==0.26.0 pytest-trio==0.8.0 Quart==0.22.0 quart-trio==0.12.0 sniffio==1.3.1 \
    sortedcontainers==2.4.0 spinf-client==0.3.1 tomlkit==0.15.3 trio==0.35.0 Werkzeug==3.1.9 wsproto==1.3.2 \
    compressed-tensors==0.20.1 loguru==0.7.3 spinf-serve==0.1.1 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
du -sh .whl
