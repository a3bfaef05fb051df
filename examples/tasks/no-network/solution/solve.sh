#!/bin/bash
set -euo pipefail
awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' /proc/net/dev > /app/interfaces.txt
cat /app/interfaces.txt
