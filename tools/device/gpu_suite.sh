#!/usr/bin/env bash
# The whole test suite on the GPU machine, as a user with a GPU would run `make test` (one H200, ~6 minutes:
# timeout_s 480; carry .whl and .devcache). The machine's image lacks the server's packages: fetch them first,
#   ../shared/tools/device-wheels.sh gguf==0.19.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 \
#     pydantic_core==2.50.5 uvicorn==0.54.0 sse-starlette==3.7.0 openai==3.57.0 anthropic==2.15.0 jiter==0.19.0 \
#     docstring_parser==0.18.0 typing-inspection==0.4.5 annotated-types==0.8.0 distro sniffio==1.3.1
# (without them tests/serve is left out). Fourteen pytest workers, one torch thread each (session 22's run with
# torch's sixteen threads a worker timed out a dozen CPU-heavy tests), a test failing past 120 s; the failures'
# names into $OUT/failed.txt. The image's transformers (5.17) fails the tokenizer tests, which need >= 5.24.
set -uo pipefail
BUDGET=${BUDGET:-460}
source tools/device/parts.sh || exit 1
SERVE=--ignore=tests/serve
python3 -c "import fastapi, uvicorn, sse_starlette, openai, anthropic" 2>/dev/null && SERVE=
export OMP_NUM_THREADS=1
part suite 440 python3 -m pytest -v -n 14 --timeout=120 -rfE -p no:cacheprovider tests $SERVE
grep -E "^(FAILED|ERROR) " $L/suite.log | cut -c1-220 | sort -u > "$OUT/failed.txt"
grep -E "[0-9]+ passed" $L/suite.log | tail -1
finish 10
