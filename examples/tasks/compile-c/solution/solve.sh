#!/bin/bash
set -euo pipefail
cd /src
tcc -o collatz collatz.c
./collatz 27 > answer.txt
